"""End-to-end checks of the pixel_mnist pipeline (decoupled HRNN) on its tiny preset, through the CLI."""
import json

import numpy as np
import pytest
import tensorflow as tf

from pipelines.pixel_mnist import digits_images, pixel_order
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES
from tests.pipelines.cli_runner import assert_rejected_in_one_line, export_metrics, run_cli, run_tiny
from tests.pipelines.epoch_reports import assert_sections, last_epoch_values, trained_model_and_data

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def permuted_run(tmp_path_factory):
    """Runs the tiny preset with permuted pixels once, for the tests that read its result and export."""
    export = run_tiny(tmp_path_factory.mktemp("exports"), "pixel_mnist", "permute=true")
    return export, export_metrics(export)


def test_permutation_is_fixed_and_identity_without_permute():
    np.testing.assert_array_equal(pixel_order(4, False), np.arange(16))
    first, second = pixel_order(28, True), pixel_order(28, True)
    np.testing.assert_array_equal(first, second)
    assert sorted(first) == list(range(784)) and not np.array_equal(first, np.arange(784))


def test_tiny_run_reports_accuracy_beside_baselines(permuted_run):
    export, metrics = permuted_run
    assert set(metrics["metrics"]) == {"accuracy", "cross_entropy"}
    assert set(metrics["baseline"]) == {"majority_class", "logistic_regression"}
    assert metrics["baseline"]["logistic_regression"]["accuracy"] > 0.5
    assert metrics["data"]["steps"] == 64 and metrics["data"]["permute"] is True
    state = json.loads((export / "assets.extra" / "state.json").read_text())
    np.testing.assert_array_equal(state["order"], pixel_order(8, True))


def test_predict_classifies_png_files(permuted_run, capsys, tmp_path):
    export, _ = permuted_run
    images, labels = digits_images()
    paths = []
    for i in range(2):
        big = tf.image.resize(images[i][..., None], [28, 28]).numpy()
        paths.append(tmp_path / f"digit{labels[i]}.png")
        paths[-1].write_bytes(tf.io.encode_png(np.round(big).astype("uint8")).numpy())
    code, answer, _ = run_cli(capsys, "predict", str(export), *map(str, paths), "--json")
    assert code == 0 and len(answer["predictions"]) == 2
    for row in answer["predictions"]:
        assert 0 <= row["label"] <= 9 and abs(sum(row["probabilities"]) - 1) < 1e-3
    (tmp_path / "note.txt").write_text("not an image")
    code, _, err = run_cli(capsys, "predict", str(export), str(tmp_path / "note.txt"))
    assert code == 2 and "not a JPEG, PNG, GIF or BMP image" in err


@pytest.mark.parametrize("argv, message", [
    (["--set", "mode=lstm"], "'mode'"),
    (["--set", "beta=-1"], "'beta'"),
    (["--data", "tfds:mnist"], "tfds:mnist"),
    (["--data", "digits.csv"], "digits.csv: file not found"),
    (["--data", __file__], "expected a folder with one sub-folder per digit (0/ ... 9/) of images, or tfds:mnist"),
])
def test_bad_config_or_data_exits_2_with_one_line(capsys, tmp_path, argv, message):
    assert_rejected_in_one_line(capsys, tmp_path, "pixel_mnist", argv, message)


def test_bad_digit_folders_are_one_line_errors_naming_the_folder_or_file(capsys, tmp_path):
    folder = tmp_path / "digits"
    (folder / "seven").mkdir(parents=True)
    assert_rejected_in_one_line(capsys, tmp_path / "out", "pixel_mnist", ["--data", str(folder)],
                                f"{folder / 'seven'}: expected sub-folders named by digits 0-9")
    (folder / "seven").rmdir()
    (folder / "7").mkdir()
    (folder / "7" / "scan.png").write_bytes(b"not an image")
    assert_rejected_in_one_line(capsys, tmp_path / "out", "pixel_mnist", ["--data", str(folder)], "scan.png")


def test_epoch_accuracy_is_that_of_the_first_validation_images(tiny_exports, tiny_report):
    result, _ = tiny_report("pixel_mnist")[1:]
    logged = last_epoch_values(result, ["accuracy"])
    model, data = trained_model_and_data(tiny_exports, "pixel_mnist")
    pixels, labels = data.arrays["val"][0][:EPOCH_METRIC_EXAMPLES], data.arrays["val_labels"][:EPOCH_METRIC_EXAMPLES]
    assert len(labels) >= 5
    predicted = model.predict(pixels, verbose=0)[:, -1].argmax(-1)
    assert logged["accuracy"] == (predicted == labels).mean()  # a share of whole images: exact


def test_report_names_the_mode_beside_the_accuracy_curve(tiny_exports, tiny_report):
    result, arrays = tiny_report("pixel_mnist")[1:]
    assert_sections("pixel_mnist", result, arrays, ["task-metric", "memory-bench"], figures=1)
