"""End-to-end checks of the copy_task pipeline (decoupled HRNN) on its tiny preset, through the CLI."""
import json
from pathlib import Path

import numpy as np
import pytest

from pipelines.copy_task import BLANK, CopyTask, CopyTaskConfig, copy_sequences
from seqapps.config import resolve_config
from seqapps.pipeline import EPOCH_METRIC_EXAMPLES
from tests.export_harness import call_in_tensorflow_only_process, decoded
from tests.pipelines.cli_runner import assert_rejected_in_one_line, run_cli
from tests.pipelines.epoch_reports import assert_sections, last_epoch_values, trained_model_and_data

pytestmark = pytest.mark.large


@pytest.fixture(scope="module")
def copy_run(tiny_run):
    """The session's tiny run (a private copy of its export), for the tests that read its export."""
    return Path(tiny_run("copy_task")["export"])


def test_sequences_hold_the_string_then_blanks_and_score_only_the_copy():
    inputs, targets = copy_sequences(3, 12, 4, np.random.default_rng(0))
    assert inputs.shape == (3, 12) and targets.shape == (3, 12, 2)
    assert (inputs[:, 4:] == BLANK).all() and set(np.unique(inputs[:, :4])) <= {0, 1}
    np.testing.assert_array_equal(targets[:, 4:8, 0], inputs[:, :4])
    assert (targets[:, 4:8, 1] == 3.0).all() and targets[:, :4, 1].sum() == targets[:, 8:, 1].sum() == 0


def test_tiny_run_reports_bpc_beside_the_uniform_baseline(copy_run):
    metrics = json.loads((copy_run / "assets.extra" / "metrics.json").read_text())
    assert set(metrics["metrics"]) == {"bpc", "bit_accuracy", "solved"}
    assert 0 < metrics["metrics"]["bpc"] < 3
    assert metrics["baseline"] == {"uniform_bits": {"bpc": 1.0, "bit_accuracy": 0.5, "solved": 0.0}}


def test_predict_copies_bit_strings(copy_run, capsys):
    code, answer, _ = run_cli(capsys, "predict", str(copy_run), "0110", "1", "--json")
    assert code == 0
    copies = answer["copies"]
    assert [row["input"] for row in copies] == ["0110", "1"]
    assert [len(row["copy"]) for row in copies] == [4, 1] and set("".join(r["copy"] for r in copies)) <= {"0", "1"}
    code, _, err = run_cli(capsys, "predict", str(copy_run), "01a")
    assert code == 2 and "0s and 1s" in err and len(err.strip().splitlines()) == 1


def test_export_copies_strings_of_any_length_up_to_the_trained_one(copy_run):
    answer = call_in_tensorflow_only_process(copy_run, [("serving_default", {"bits": np.array(["0110", "10"],
                                                                                          dtype=object)})])
    assert [len(c) for c in decoded(answer["outputs"][0]["copy"])] == [4, 2]


@pytest.mark.parametrize("settings, message", [
    (["mode=flat"], "'mode'"),
    (["beta=-0.5"], "'beta'"),
    (["mode=gr_hrnn", "beta=1"], "'beta'"),  # gr_hrnn has no decoders
    (["string_length=11"], "'string_length'"),
])
def test_bad_config_exits_2_with_one_line(capsys, tmp_path, settings, message):
    arguments = [part for setting in settings for part in ("--set", setting)]
    assert_rejected_in_one_line(capsys, tmp_path, "copy_task", arguments, message)


def test_paper_presets():
    """The paper's 2-level (T=200, k=10, L=100) and 3-level (k=5 then 25, T=1000, L=500) settings."""
    full = resolve_config(CopyTaskConfig, "full")
    assert (full.length, full.period_list(), full.string_length, full.mode) == (200, [10], 100, "decoupled")
    three = resolve_config(CopyTaskConfig, "three_level")
    assert (three.length, three.period_list(), three.string_length, three.units, three.beta) == (
        1000, [5, 5], 500, [64, 256, 1024], [0.1, 1.0])
    assert resolve_config(CopyTaskConfig, "three_level", overrides=["beta=0.1,0"]).beta == [0.1, 0.0]


def test_epoch_metrics_are_the_task_metrics_of_the_first_validation_sequences(tiny_exports, tiny_report):
    result, _ = tiny_report("copy_task")[1:]
    logged = last_epoch_values(result, ["bpc", "bit_accuracy", "solved"])
    model, data = trained_model_and_data(tiny_exports, "copy_task")
    inputs, targets = (part[:EPOCH_METRIC_EXAMPLES] for part in data.arrays["val"])
    logits = model.predict(inputs, verbose=0).astype(np.float64)
    scored, bits = targets[..., 1] > 0, targets[..., 0].astype(int)
    nats = np.logaddexp(logits[..., 0], logits[..., 1]) - np.where(bits == 1, logits[..., 1], logits[..., 0])
    bpc = nats[scored].mean() / np.log(2)
    # the same float32 logits, reduced in another order: 1e-5 relative is float32 rounding, far below a training step
    np.testing.assert_allclose(logged["bpc"], bpc, rtol=1e-5)
    assert logged["bit_accuracy"] == (logits.argmax(-1) == bits)[scored].mean()
    assert logged["solved"] == float(bpc < CopyTaskConfig.solved_bpc)


def test_report_names_the_mode_beside_the_bits_per_bit_curve(tiny_exports, tiny_report):
    result, arrays = tiny_report("copy_task")[1:]
    assert_sections("copy_task", result, arrays, ["task-metric", "memory-bench"], figures=1)  # no bench was run
    mode_section = CopyTask().report_sections(result, arrays)[0]
    assert mode_section.title == "Task metric over training (decoupled)"
    assert "decoupled HRNN, restricted gradients" in mode_section.blocks[0].text
