"""tensorflow-datasets readers, on data faked by ``tfds.testing.mock_data`` (no network, no local copy)."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from seqapps.data import datasets
from seqapps.errors import DataError
from tests.pipelines.cli_runner import run_cli


def test_image_sets_are_read_as_train_and_test_arrays_or_one_named_split():
    with tfds.testing.mock_data(num_examples=6):
        loaded = datasets.tfds_images("tfds:mnist")
        named = datasets.tfds_images("tfds:mnist:test")
    assert set(loaded) == {"train", "test"} and set(named) == {"train"}
    images, labels = loaded["train"]
    assert images.shape == (6, 28, 28) and images.dtype == np.float32 and labels.dtype == np.int64
    assert 0 <= images.min() and images.max() <= 255 and set(labels) <= set(range(10))


@pytest.mark.parametrize("name", ["lm1b", "tiny_shakespeare"])
def test_text_sets_are_read_as_corpora_of_non_blank_lines(name):
    with tfds.testing.mock_data(num_examples=5):
        corpus = datasets.read_corpus(f"tfds:{name}")
    assert corpus.source == f"tfds:{name}" and corpus.lines and all(line.strip() == line != "" for line in corpus.lines)


def test_translation_sets_are_read_as_source_target_pairs():
    with tfds.testing.mock_data(num_examples=4):
        pairs = datasets.tfds_pairs("tfds:ted_hrlr_translate/pt_to_en")
        with pytest.raises(DataError, match="not a translation data set"):
            datasets.tfds_pairs("tfds:mnist")
    assert len(pairs) == 4 and pairs.origin == "tfds:ted_hrlr_translate/pt_to_en"
    assert all(isinstance(text, str) and text for text in pairs.sources + pairs.targets)


@pytest.mark.parametrize("data, message", [
    ("tfds:mnist", "run `tfds build mnist`"),  # no local copy in the empty data folder
    ("tfds:no_such_set", "'no_such_set' is not a tensorflow-datasets name"),
    ("tfds:", "expected tfds:NAME or tfds:NAME:SPLIT"),
])
def test_missing_or_unknown_sets_are_one_line_naming_the_fix(monkeypatch, tmp_path, data, message):
    monkeypatch.setattr(tfds, "load", lambda *args, **kwargs: tfds.builder("mnist", data_dir=str(tmp_path)).as_dataset(
        split="train"))
    with pytest.raises(DataError, match=message) as caught:
        datasets.tfds_dataset(data)
    assert "\n" not in str(caught.value)


@pytest.mark.large
def test_pixel_mnist_trains_on_a_tfds_set(capsys, tmp_path):
    with tfds.testing.mock_data(num_examples=60):
        code, result, err = run_cli(capsys, "run", "pixel_mnist", "--preset", "tiny", "--data", "tfds:mnist",
                                    "--json", "--out", str(tmp_path))
    assert code == 0, err
    assert result["data"]["source"] == "tfds:mnist"


def test_speech_sets_are_written_once_as_a_folder_of_wav_files_and_transcripts(monkeypatch, tmp_path):
    import soundfile

    from seqapps.data import speech

    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    with tfds.testing.mock_data(num_examples=3):
        folder = datasets.tfds_audio_folder("tfds:librispeech:test")
        again = datasets.tfds_audio_folder("tfds:librispeech:test")
        with pytest.raises(DataError, match="expected a speech data set with audio and text"):
            datasets.tfds_audio_folder("tfds:mnist")
    assert folder == again == tmp_path / "tfds" / "librispeech_test"
    utterances = speech.read_transcripts(folder)
    assert len(utterances) == 3
    waveform, rate = soundfile.read(utterances[0].path, dtype="int16")
    assert rate == 16000 and waveform.ndim == 1 and waveform.size > 0


def test_captioning_sets_are_written_once_as_a_folder_of_jpegs_and_captions(monkeypatch, tmp_path):
    from seqapps.data import captions

    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    with tfds.testing.mock_data(num_examples=3):
        folder = datasets.tfds_caption_folder("tfds:coco_captions:val")
        with pytest.raises(DataError, match="expected a captioning data set with image and caption"):
            datasets.tfds_caption_folder("tfds:mnist")
    assert folder == tmp_path / "tfds" / "coco_captions_val"
    read = captions.read_captions(folder)  # opens every image
    assert len(read) == 3 and all(caption.strip() for group in read.captions for caption in group)
