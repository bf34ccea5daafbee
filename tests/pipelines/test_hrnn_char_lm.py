"""End-to-end checks of the hrnn_char_lm pipeline (word-boundary HRNN) on its tiny preset, through the CLI."""

import numpy as np
import pytest

from pipelines.hrnn_char_lm import weighted_windows
from tests.pipelines.cli_runner import assert_rejected_in_one_line, export_metrics, run_cli, run_tiny

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """Runs the tiny preset (pip-only text) once in hrnn mode, for the tests that read its export."""
    export = run_tiny(tmp_path_factory.mktemp("exports"), "hrnn_char_lm", "mode=hrnn")
    return export, export_metrics(export)


def test_windows_predict_the_next_character_with_weight_one():
    inputs, targets = weighted_windows(np.arange(10, dtype=np.int32), 3, "the text")
    np.testing.assert_array_equal(inputs, [[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    np.testing.assert_array_equal(targets[..., 0], [[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    assert (targets[..., 1] == 1).all()


def test_tiny_run_reports_bpc_beside_the_unigram_baseline(lm_run):
    _, metrics = lm_run
    vocabulary = metrics["data"]["vocabulary"]
    assert metrics["data"]["source"] == "pydoc_data.topics"
    assert 0 < metrics["metrics"]["bpc"] < np.log2(vocabulary) + 1
    assert 2 < metrics["baseline"]["unigram"]["bpc"] < np.log2(vocabulary)


def test_predict_scores_text_and_names_next_characters(lm_run, capsys):
    export, _ = lm_run
    code, answer, _ = run_cli(capsys, "predict", str(export), "the value", "a longer line of words ", "--json")
    assert code == 0 and len(answer["predictions"]) == 2
    for row in answer["predictions"]:
        assert row["bits_per_character"] > 0 and len(row["next"]) == 5
        assert all(len(n["char"]) == 1 or n["char"] == "<unk>" for n in row["next"])
        assert 0 < sum(n["p"] for n in row["next"]) <= 1.0001


@pytest.mark.parametrize("setting, message", [
    ("mode=restricted", "'mode'"),
    ("beta=-2", "'beta'"),
    ("mode=mr_hrnn", "'mode'"),
    ("units=8,8,8", "'units'"),
])
def test_bad_config_exits_2_with_one_line(capsys, tmp_path, setting, message):
    assert_rejected_in_one_line(capsys, tmp_path, "hrnn_char_lm", ["--set", setting], message)
