"""Tests of the image_captioning pipeline: baselines, a tiny end-to-end run, its report, real image bytes and
bad input."""
import io
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

from pipelines import image_captioning
from seqapps import runner
from seqapps.config import resolve_config
from seqapps.data import scenes
from seqapps.errors import ConfigError
from seqapps.export import ExportCalls
from seqapps.report import run_folder
from seqapps.report.document import Table, figures_of
from tests.export_harness import call_in_tensorflow_only_process, decoded
from tests.pipelines.cli_runner import assert_rejected_in_one_line
from tests.pipelines.report_checks import assert_attention_sums_to_one, assert_figures_decode, sections_by_anchor


def test_most_frequent_and_nearest_neighbour_baselines():
    train = [["a red box", "red box"], ["a blue ball"], ["a red box"]]
    assert image_captioning.most_frequent(train) == "a red box"
    features = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1]])
    assert image_captioning.nearest_neighbour(features, train, np.array([[0.1, 2.0], [3.0, 0.0]])) == [
        "a blue ball", "a red box"]


@pytest.mark.parametrize("train_style", scenes.TRAINING_STYLES)
def test_the_held_out_style_never_appears_in_training_and_is_all_of_test_style(tmp_path, monkeypatch, train_style):
    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    parts = image_captioning.scene_splits(resolve_config(image_captioning.CaptioningConfig, "tiny",
                                                         overrides=[f"train_style={train_style}"]))
    styles = {name: [scenes.read_scenes(Path(part.source).parent)[image.name].style for image in part.images]
              for name, part in parts.items()}
    assert {name: len(found) for name, found in styles.items()} == {
        "train": 120, "val": 20, "test": 20, "test_novel": 20, "test_style": 20}
    assert all(style == train_style for name in ("train", "val") for style in styles[name])
    assert all(style == scenes.FLAT.name for name in ("test", "test_novel") for style in styles[name])
    assert set(styles["test_style"]) == {scenes.PHOTO.name}
    novel = scenes.read_scenes(Path(parts["test_novel"].source).parent)
    assert all(novel[image.name].held_out for image in parts["test_novel"].images)
    held = scenes.read_scenes(Path(parts["test_style"].source).parent)
    assert not any(held[image.name].held_out for image in parts["test_style"].images)  # only the style is new


def test_role_ids_share_one_input_per_colour_shape_and_plural_and_keep_an_exports_ids_when_grown():
    words = ["<unk>", "</s>", "<s>", "a", "red", "square", "blue", "squares", "circle", "circles", "small"]
    assert image_captioning.role_ids(words) == [0, 1, 2, 3, 4, 5, 4, 7, 5, 7, 10]
    grown = image_captioning.role_ids(words + ["purple", "temple"])
    assert grown[:len(words)] == image_captioning.role_ids(words) and grown[len(words):] == [4, 12]


def test_the_colour_shape_streams_read_shape_without_colour_and_colour_without_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    pipeline = image_captioning.ImageCaptioning()
    config = resolve_config(image_captioning.CaptioningConfig, "tiny",
                            overrides=["image_streams=colour_shape"])
    model = pipeline.build_model(config, pipeline.load_data(config, None))
    streams = keras.Model(model.input["image"], [model.get_layer(f"pool_{len(config.cnn_filters)}").output,
                                                 model.get_layer("colour_pool").output])
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (1, config.image_size, config.image_size, 3)).astype("float32")
    # the same grey view (the channels' mean) in other colours: a channel permutation recolours every pixel
    recoloured = image[..., ::-1]
    (shape, colour), (shape_recoloured, colour_recoloured) = streams(image), streams(recoloured)
    np.testing.assert_allclose(np.asarray(shape), np.asarray(shape_recoloured), rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.asarray(colour), np.asarray(colour_recoloured), atol=1e-3)
    # the colour stream sees one pixel at a time: moving pixels within a pooling cell leaves it unchanged
    cell = 2 ** len(config.cnn_filters)
    shuffled = image.copy()
    shuffled[0, :cell, :cell] = shuffled[0, :cell, :cell][::-1, ::-1]
    np.testing.assert_allclose(np.asarray(streams(shuffled)[1]), np.asarray(colour), rtol=1e-6)


def test_the_local_contrast_shape_view_ignores_the_background_level(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQAPPS_DATA", str(tmp_path))
    pipeline = image_captioning.ImageCaptioning()
    image = np.full((1, 32, 32, 3), 200.0, "float32")
    image[0, 8:20, 6:18] = (40, 80, 220)  # a blue square on light grey
    changes = {}
    for view in image_captioning.SHAPE_VIEWS:
        config = resolve_config(image_captioning.CaptioningConfig, "tiny",
                                overrides=["image_streams=colour_shape", f"shape_view={view}"])
        model = pipeline.build_model(config, pipeline.load_data(config, None))
        shape_stream = keras.Model(model.input["image"], model.get_layer(f"pool_{len(config.cnn_filters)}").output)
        # every pixel 60 levels darker: the grey view shifts, its local contrast does not
        changes[view] = np.abs(np.asarray(shape_stream(image)) - np.asarray(shape_stream(image - 60.0))).max()
    assert changes["local_contrast"] < 1e-5 < 1e-2 < changes["grey"]


def test_the_local_contrast_shape_view_needs_the_colour_shape_streams():
    with pytest.raises(ConfigError, match="shape_view.*image_streams=colour_shape"):
        resolve_config(image_captioning.CaptioningConfig, "tiny", overrides=["shape_view=local_contrast"])


def test_colour_shape_streams_need_the_small_convnet():
    with pytest.raises(ConfigError, match="image_streams.*needs cnn=small"):
        resolve_config(image_captioning.CaptioningConfig, "tiny",
                       overrides=["image_streams=colour_shape", "cnn=MobileNetV3Small"])


@pytest.fixture(scope="module")
def tiny_export(tiny_run):
    """The session's tiny run (a two-block convnet and a 16-unit LSTM on 120 generated scenes), a private copy."""
    return tiny_run("image_captioning")


@pytest.mark.large
def test_tiny_run_reports_bleu_and_fact_accuracy_on_every_test_split_with_baselines(tiny_export):
    metrics, baselines = tiny_export["metrics"], tiny_export["baseline"]
    for split in ("test", "test_novel", "test_style"):
        for search in ("greedy", "beam"):
            assert all(0 <= metrics[f"{split}/{search}_bleu{n}"] <= 100 for n in range(1, 5))
            assert 0 <= metrics[f"{split}/{search}_fact_accuracy"] <= 1
        for baseline in ("most_frequent", "nearest_neighbour"):
            assert 0 <= baselines[baseline][f"{split}/bleu4"] <= 100
    assert metrics["signature/test/greedy_bleu4"].startswith("nrefs:3|")  # three phrasings per scene
    assert tiny_export["data"]["images"] == {"train": 120, "val": 20, "test": 20, "test_novel": 20, "test_style": 20}


def _encoded(mode: str, size: tuple[int, int], fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, 128 if mode in ("L", "P") else (200, 30, 30, 255)[: len(mode)]).save(buffer, fmt)
    return buffer.getvalue()


@pytest.mark.large
def test_export_captions_jpeg_png_gray_rgba_and_large_images_in_a_tensorflow_only_process(tiny_export):
    images = np.array([_encoded("RGB", (640, 480), "JPEG"), _encoded("L", (33, 20), "PNG"),
                       _encoded("RGBA", (50, 70), "PNG"), _encoded("RGB", (3000, 2000), "JPEG")], dtype=object)
    answer = call_in_tensorflow_only_process(tiny_export["export"], [
        (name, {"image_bytes": images}) for name in ("serving_default", "beam", "attention")])
    greedy, beam, attention = answer["outputs"]
    assert len(decoded(greedy["caption"])) == 4 and np.all(np.isfinite(greedy["score"]))
    assert beam["captions"].shape == (4, 2) and np.all(beam["scores"][:, 0] >= beam["scores"][:, 1])
    assert decoded(attention["caption"]) == decoded(greedy["caption"])
    words = np.array([[w != "" for w in row] for row in decoded(attention["words"])])
    assert attention["attention"].shape[:2] == words.shape and attention["attention"].shape[2] == 8 * 8  # 32px / 4
    np.testing.assert_allclose(attention["attention"].sum(-1)[words], 1.0, atol=1e-5)


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


@pytest.mark.large
def test_report_data_holds_the_pixels_the_export_captions_and_its_attention_per_word(tiny_exports, tiny_report):
    _, result, arrays = tiny_report("image_captioning")
    assert arrays["split"].tolist() == ["test"] * 2 + ["test_novel"] * 2 + ["test_style"] * 2
    assert arrays["image"].tolist() == [sample["image"] for split in image_captioning.TEST_SPLITS
                                        for sample in result["metrics"][f"samples/{split}"][:2]]
    assert arrays["pixels"].dtype == np.uint8 and arrays["pixels"].shape == (6, 32, 32, 3)
    # The stored pixels, sent again as lossless PNGs, get the captions the report shows.
    export = ExportCalls(tiny_exports["image_captioning"]["export"])
    images = {"image_bytes": np.array([_png(pixels) for pixels in arrays["pixels"]], dtype=object)}
    assert arrays["greedy"].tolist() == decoded(export("serving_default", images)["caption"])
    assert arrays["beam"].tolist() == [row[0] for row in decoded(export("beam", images)["captions"])]
    assert [image_captioning.TOKENIZER.join([word for word in row if word]) for row in arrays["words"].tolist()] == \
        arrays["greedy"].tolist()
    # Each word's weights over the 8x8 feature-map grid sum to 1; the padding after the caption gets none.
    assert arrays["attention"].shape == (*arrays["words"].shape, 8 * 8)
    assert_attention_sums_to_one(arrays["attention"], arrays["words"] != "")


@pytest.mark.large
def test_report_sections_show_captions_attention_and_fact_accuracy_per_split_even_without_report_data(tiny_report):
    folder, result, arrays = tiny_report("image_captioning")
    sections = sections_by_anchor(image_captioning.ImageCaptioning(), result, arrays)
    assert list(sections) == ["captions", "attention", "fact-accuracy"]
    metrics, baselines = result["metrics"], result["baseline"]
    facts = next(block for block in sections["fact-accuracy"].blocks if isinstance(block, Table))
    splits = tuple(image_captioning.TEST_SPLITS)
    assert list(facts.columns) == ["", "seen (test)", "novel (test_novel)", "held-out style (test_style)"]
    assert [list(row) for row in facts.rows] == [
        ["greedy search", *(100 * metrics[f"{split}/greedy_fact_accuracy"] for split in splits)],
        ["beam search", *(100 * metrics[f"{split}/beam_fact_accuracy"] for split in splits)],
        *([name, *(100 * baselines[key][f"{split}/fact_accuracy"] for split in splits)]
          for name, key in (("most frequent caption", "most_frequent"), ("nearest neighbour", "nearest_neighbour")))]
    captioned = [split for split, caption in zip(arrays["split"], arrays["greedy"]) if caption]
    expected = [f"attention_{split}" for split in splits if split in captioned]
    assert [figure.name for figure in figures_of([sections["attention"]])] == expected
    assert_figures_decode(sections.values())
    samples = next(block for block in sections["captions"].blocks if isinstance(block, Table))
    assert len(samples.rows) == sum(len(metrics[f"samples/{split}"]) for split in splits)
    page = (folder / run_folder.REPORT_FILE).read_text(encoding="utf-8")
    assert all(f'id="{anchor}"' in page for anchor in sections) and 'id="figure-test_captions"' in page
    # Rebuilt from an export alone (no report data): no pictures of images, the tables and charts stay.
    without = sections_by_anchor(image_captioning.ImageCaptioning(), result, {})
    assert list(without) == list(sections)
    assert [figure.name for figure in figures_of(list(without.values()))] == ["splits_fact_accuracy", "splits_bleu4"]


@pytest.mark.large
def test_predict_captions_an_image_file(tiny_export, tmp_path):
    path = tmp_path / "photo.png"
    path.write_bytes(_encoded("RGB", (90, 60), "PNG"))
    text, value = runner.predict(tiny_export["export"], [str(path)])
    assert text.startswith(f"{path}: ") and value["inputs"] == [str(path)] and len(value["scores"]) == 1


@pytest.mark.parametrize("rows, message", [
    ("a.png,a red square\nmissing.png,a blue circle\n", "line 3"),
    ("a.png,\n", "line 2: empty caption for image a.png"),
])
def test_bad_caption_folders_are_one_line_errors(capsys, tmp_path, rows, message):
    folder = tmp_path / "mine"
    folder.mkdir()
    Image.new("RGB", (16, 16)).save(folder / "a.png")
    (folder / "captions.csv").write_text("image,caption\n" + rows, encoding="utf-8")
    assert_rejected_in_one_line(capsys, tmp_path / "out", "image_captioning", ["--data", str(folder)], message)


def test_twenty_four_user_images_split_as_requested_and_two_are_refused(capsys, tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    for i in range(24):
        Image.new("RGB", (8, 8), (10 * i, 0, 0)).save(folder / f"{i}.png")
    (folder / "captions.csv").write_text("image,caption\n" + "".join(f"{i}.png,photo {i}\n" for i in range(24)))
    config = image_captioning.CaptioningConfig(val_fraction=0.25, test_fraction=0.125)
    parts = image_captioning.user_splits(config, str(folder))
    assert {name: len(part) for name, part in parts.items()} == {"train": 15, "val": 6, "test": 3}
    assert sorted(str(path) for part in parts.values() for path in part.images) == sorted(
        str(folder / f"{i}.png") for i in range(24))
    (folder / "captions.csv").write_text("image,caption\n0.png,a photo\n1.png,another photo\n")
    assert_rejected_in_one_line(capsys, tmp_path / "out", "image_captioning", ["--data", str(folder)],
                                "2 images are too few to split into training, validation and test")


def _new_word_photos(folder, count: int = 12):
    """Red triangles captioned "a red temple" and blue discs "a blue flower" (temple and flower: new words)."""
    from PIL import ImageDraw

    folder.mkdir()
    rows = ["image,caption"]
    for i in range(count):
        image = Image.new("RGB", (32, 32), "white")
        draw, shift = ImageDraw.Draw(image), i // 2
        if i % 2 == 0:
            draw.polygon([(4 + shift, 26), (16, 4 + shift), (28 - shift, 26)], fill=(220, 20, 20))
        else:
            draw.ellipse([6 + shift, 6 + shift, 26 - shift, 26 - shift], fill=(20, 20, 220))
        image.save(folder / f"{i}.png")
        rows.append(f"{i}.png,{'a red temple' if i % 2 == 0 else 'a blue flower'}")
    (folder / "captions.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return folder


SCENE_WORDS = ["<unk>", "</s>", "<s>", "a", "red", "blue", "square"]


@pytest.mark.parametrize("mode, added", [("extend", ["flower", "temple"]), ("keep", [])])
def test_fine_tuning_data_extends_the_vocabulary_with_new_words_unless_kept(tmp_path, mode, added):
    from seqapps.config import resolve_config
    from seqapps.pipeline import VOCABULARIES

    pipeline = image_captioning.ImageCaptioning()
    config = resolve_config(image_captioning.CaptioningConfig, "tiny",
                            overrides=[f"vocabulary={mode}"])
    state = {"vocabulary": SCENE_WORDS, "image_size": 32, "max_caption_length": 24, "beam_size": 2,
             "length_penalty": 0.6}
    data = pipeline.load_data(config, str(_new_word_photos(tmp_path / "photos")), state=state)
    words = data.state["vocabulary"]
    assert words[: len(SCENE_WORDS)] == SCENE_WORDS and sorted(words[len(SCENE_WORDS):]) == added  # old ids kept
    # every caption has one new word in three
    assert data.report[VOCABULARIES]["words"] == {"added": words[len(SCENE_WORDS):], "size": len(words),
                                                  "oov_rate": 0.0 if added else round(1 / 3, 4)}
    targets = np.concatenate([t["target_out"].numpy() for t, _, _ in data.train])
    assert (targets == len(SCENE_WORDS)).any() == bool(added) and (targets == 0).any() == (not added)


@pytest.mark.large
def test_fine_tuning_on_captions_with_new_words_emits_them(tiny_export, tmp_path):
    """The acceptance test of issue 22: after fitting captions with new words, the export says them."""
    import tensorflow as tf

    folder = _new_word_photos(tmp_path / "photos")
    result = runner.finetune("image_captioning", tiny_export["export"], str(folder), overrides=[
        "epochs=12", "learning_rate=0.01", "early_stopping_patience=20", "max_eval_images=1"])
    assert sorted(result["data"]["vocabularies"]["words"]["added"]) == ["flower", "temple"]
    images = np.array([(folder / f"{i}.png").read_bytes() for i in (10, 11)], dtype=object)
    captions = tf.saved_model.load(result["export"]).signatures["serving_default"](image_bytes=tf.constant(images))
    temple, flower = (caption.split() for caption in decoded(captions["caption"]))
    assert "temple" in temple and "flower" in flower, (temple, flower)
