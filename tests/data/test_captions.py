"""Tests of the image-caption CSV reader (seqapps.data.captions)."""
import pytest
from PIL import Image

from seqapps.data import captions
from seqapps.errors import DataError


def _folder(tmp_path, rows: str, images=("a.png", "b.jpg")):
    for name in images:
        Image.new("RGB", (8, 6), (200, 10, 10)).save(tmp_path / name)
    (tmp_path / "captions.csv").write_text("image,caption\n" + rows, encoding="utf-8")
    return tmp_path


def test_several_rows_per_image_become_its_references(tmp_path):
    folder = _folder(tmp_path, 'a.png,a red  box\nb.jpg,"a box, red"\na.png,red box\n')
    read = captions.read_captions(folder)
    assert [p.name for p in read.images] == ["a.png", "b.jpg"]
    assert read.captions == [["a red box", "red box"], ["a box, red"]]
    assert read.source == str(folder / "captions.csv")


@pytest.mark.parametrize("rows, message", [
    ("a.png,a box\nc.png,missing\n", "line 3"),
    ("a.png,\n", "line 2: empty caption for image a.png"),
    ("a.png,a box\n,no image\n", "line 3: empty image name"),
    ("notes.txt,not an image\n", "line 2"),
])
def test_bad_rows_name_the_csv_and_line(tmp_path, rows, message):
    folder = _folder(tmp_path, rows)
    (folder / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match=message) as raised:
        captions.read_captions(folder / "captions.csv")
    assert "captions.csv" in str(raised.value) and "\n" not in str(raised.value)


def test_truncated_jpeg_is_a_data_error(tmp_path):
    folder = _folder(tmp_path, "b.jpg,a box\n")
    data = (folder / "b.jpg").read_bytes()
    (folder / "b.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="line 2"):
        captions.read_captions(folder)


def test_missing_csv_or_columns(tmp_path):
    with pytest.raises(DataError, match="no captions.csv in the folder"):
        captions.read_captions(tmp_path)
    (tmp_path / "captions.csv").write_text("file,text\na.png,x\n")
    with pytest.raises(DataError, match="no image or caption column; the header is file,text"):
        captions.read_captions(tmp_path)
