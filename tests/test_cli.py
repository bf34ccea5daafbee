"""The command line's promises: one stderr line on bad input, valid JSON always, names checked first."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from seqapps import cli
from seqapps.pipeline import SPLIT_COUNTS, VOCABULARIES, Headline
from seqapps.summary import run_summary

pytestmark = pytest.mark.large


def seqapps(*argv, cwd=None):
    """Runs the real command in a fresh process (where TensorFlow's C++ start-up messages would show)."""
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.run([sys.executable, "-m", "seqapps.cli", *argv], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


def weather_csv(rows=60):
    times = pd.date_range("2024-01-01", periods=rows, freq="h")
    return pd.DataFrame({"timestamp": times.strftime("%Y-%m-%d %H:%M"), "temp_air": np.arange(rows) % 24 * 0.5})


def write(frame, path):
    frame.to_csv(path, index=False)
    return path


# The bad CSVs of the forecasting data issue: each is answered with one line naming file, line and column.
BAD_FILES = {
    "missing column": (lambda p: write(weather_csv().rename(columns={"temp_air": "temp"}), p),
                       "missing column 'temp_air'"),
    "non-numeric cell": (lambda p: write(weather_csv().astype({"temp_air": object}).assign(
        temp_air=lambda t: t["temp_air"].where(t.index != 7, "warm")), p), "line 9: column 'temp_air' value 'warm'"),
    "gap": (lambda p: write(weather_csv().drop(index=[20]), p), "line 22: gap in timestamps"),
    "unsorted": (lambda p: write(weather_csv().iloc[[0, 2, 1, *range(3, 60)]], p), "line 4: timestamp .* is earlier"),
    "empty file": (lambda p: p.write_bytes(b""), "the file is empty"),
    "not UTF-8": (lambda p: p.write_bytes("timestamp,temp_air\n2024-01-01,caf\xe9\n".encode("latin-1")), "not UTF-8"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_csv_prints_exactly_one_stderr_line_and_exits_2(capfd, tmp_path, case):
    make, message = BAD_FILES[case]
    make(tmp_path / "bad.csv")
    code = cli.main(["run", "weather_forecasting", "--preset", "tiny", "--data", str(tmp_path / "bad.csv"),
                     "--out", str(tmp_path / "out")])
    lines = capfd.readouterr().err.splitlines()  # file descriptor 2, where C++ messages go
    assert code == 2 and len(lines) == 1, lines
    assert "bad.csv" in lines[0] and re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["missing column", "not UTF-8"])
def test_bad_csv_in_a_fresh_process_prints_one_line_without_tensorflow_start_up_noise(tmp_path, case):
    make, message = BAD_FILES[case]
    make(tmp_path / "bad.csv")
    completed = seqapps("run", "weather_forecasting", "--preset", "tiny", "--data", str(tmp_path / "bad.csv"),
                        "--out", str(tmp_path / "out"))
    assert completed.returncode == 2
    lines = completed.stderr.splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), completed.stderr


def test_tensorflows_python_log_is_held_back_with_its_start_up_noise_and_replayed_after_a_crash():
    """TensorFlow's "retracing" notices and the like (its "tensorflow" logger) are noise on a terminal, as its
    C++ start-up lines are: ``native_stderr_to_file`` holds them back, and ``replay_native_stderr`` shows them."""
    code = """
import sys
from seqapps import cli
with cli.native_stderr_to_file(True) as log:
    import tensorflow as tf
    tf.get_logger().warning("a notice from TensorFlow")
    print("the user's line", file=sys.stderr)
sys.stderr.flush()
print("held back:", "a notice from TensorFlow" in (log.seek(0) or log.read().decode()))
cli.replay_native_stderr(log)
"""
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "held back: True"
    user_line, replayed = completed.stderr.split("the user's line\n", 1)
    assert "a notice from TensorFlow" not in user_line and "a notice from TensorFlow" in replayed


def test_unknown_names_and_missing_files_are_answered_before_tensorflow_is_imported(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("horizn: 1D\n")
    script = f"""
import sys
from seqapps import cli
codes = [cli.main(["run", "nosuch_pipeline"]),
         cli.main(["run", "weather_forecasting", "--data", {str(tmp_path / "missing.csv")!r}]),
         cli.main(["finetune", "weather_forecasting", "--from", "x", "--data", {str(tmp_path / "missing.csv")!r}]),
         cli.main(["run", "copy_task", "--set", "nosuch=1"]),
         cli.main(["run", "copy_task", "--preset", "nosuch"]),
         cli.main(["run", "load_forecasting", "--config", {str(config)!r}]),
         cli.main(["finetune", "copy_task", "--from", "x", "--data", {str(config)!r}, "--set", "unitz=4"]),
         cli.main(["finetune", "load_forecasting", "--from", {str(tmp_path / "nosuch")!r}, "--data", {str(config)!r}])]
print(codes, "tensorflow" in sys.modules, "keras" in sys.modules)
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.stdout.split() == ["[2,", "2,", "2,", "2,", "2,", "2,", "2,", "2]", "False", "False"], \
        completed.stderr
    lines = completed.stderr.splitlines()
    assert len(lines) == 8 and "unknown pipeline 'nosuch_pipeline'" in lines[0]
    assert lines[1].endswith("missing.csv: file not found") and lines[2].endswith("missing.csv: file not found")
    # The messages are resolve_config's own (the config class read from the pipeline's source).
    assert lines[3].endswith("--set: unknown config field 'nosuch' for CopyTaskConfig")
    assert lines[4].endswith("unknown preset 'nosuch'; choose one of tiny, default, full, three_level")
    assert lines[5].endswith(f"{config}: unknown config field 'horizn' for LoadConfig; did you mean 'horizon'?")
    assert lines[6].endswith("--set: unknown config field 'unitz' for CopyTaskConfig; did you mean 'units'?")
    assert lines[7].endswith(f"{tmp_path / 'nosuch'}: no such export folder (expected saved_models/NAME/VERSION)")


def test_the_config_outline_read_from_source_matches_each_imported_config_class():
    import dataclasses

    from seqapps.pipeline import REGISTRY

    for name in REGISTRY.names():
        outline, config_class = REGISTRY.config_outline(name), REGISTRY.get(name).Config
        assert outline.class_name == config_class.__name__, name
        assert outline.fields == {field.name for field in dataclasses.fields(config_class)}, name
        assert outline.presets == tuple(config_class.PRESETS), name


def test_json_failure_is_the_last_stdout_line(capsys, tmp_path):
    (tmp_path / "bad.csv").write_text("timestamp,temp\n2024-01-01,1\n")
    for argv in (["run", "weather_forecasting", "--preset", "tiny", "--data", str(tmp_path / "bad.csv")],
                 ["run", "nosuch"], ["run", "weather_forecasting", "--no-such-flag"]):
        try:
            code = cli.main([*argv, "--json", "--out", str(tmp_path / "out")])
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        captured = capsys.readouterr()
        last = json.loads(captured.out.strip().splitlines()[-1])
        assert code == 2 and last["exit_code"] == 2 and set(last) == {"error", "exit_code"}
        assert len(captured.err.strip().splitlines()) == 1 and last["error"] in captured.err


def _reject(constant):
    raise ValueError(f"{constant} is not JSON")


def test_json_never_holds_nan_a_perfectly_periodic_series_gets_null_with_a_reason(capsys, tmp_path):
    day = np.round(1000 + 300 * np.sin(np.arange(48) * 2 * np.pi / 48), 3)
    rows = 48 * 42
    frame = pd.DataFrame({"timestamp": pd.date_range("2024-01-01", periods=rows, freq="30min"),
                          "demand": np.tile(day, rows // 48)})
    frame.to_csv(tmp_path / "periodic.csv", index=False)
    code = cli.main(["run", "load_forecasting", "--preset", "tiny", "--json", "--data", str(tmp_path / "periodic.csv"),
                     "--out", str(tmp_path / "out"), "--set", "shrinkage=none"])  # one fit: MASE is what is checked
    assert code == 0
    exported = (tmp_path / "out" / "load_forecasting" / "1" / "assets.extra" / "metrics.json").read_text()
    for text in (capsys.readouterr().out.strip().splitlines()[-1], exported):
        result = json.loads(text, parse_constant=_reject)  # standard JSON: no NaN or Infinity
        # The same time yesterday is a perfect forecast on the training split: MASE divides by zero.
        assert result["metrics"]["mase"] is None and result["baseline"]["naive_daily"]["mase"] is None
        assert "zero error on the training split" in result["nulls"]["metrics.mase"]
        # Only float32 rounding of the targets (values near 1000, float32 step 6e-5) separates them.
        assert result["baseline"]["naive_daily"]["mae"] < 1e-4


def test_run_summary_lists_the_backtest_mean_and_spread_beside_the_split_metrics():
    from seqapps.runner import backtest_summary

    folds = [({"mae": m}, {"ridge": {"mae": r}}) for m, r in [(3.0, 2.0), (5.0, 4.0), (4.0, 6.0)]]
    backtest = backtest_summary(folds, ["a", "b", "c"])
    # Reference: NumPy's sample standard deviation of each column of fold values.
    assert backtest["metrics"]["mae"] == {"mean": 4.0, "std": pytest.approx(np.std([3, 5, 4], ddof=1)),
                                          "values": [3.0, 5.0, 4.0]}
    assert backtest["baseline"]["ridge"]["mae"]["mean"] == 4.0 and backtest["periods"] == ["a", "b", "c"]
    result = {"pipeline": "p", "preset": "tiny", "seconds": 1.0, "metrics": folds[-1][0], "baseline": folds[-1][1],
              "backtest": backtest, "export": "out/p/1"}
    lines = run_summary(result, (Headline("mae", "MAE", "MW"),)).splitlines()
    start = lines.index("backtest over 3 folds (mean +- standard deviation):")
    assert lines[start + 1].split() == ["MAE", "(MW)"]
    assert lines[start + 2].split() == ["model", "4", "+-", "1"]
    assert lines[start + 3].split() == ["ridge", "4", "+-", "2"]


def test_run_summary_states_what_each_fit_decided_for_the_run_and_every_backtest_fold():
    from seqapps.runner import backtest_summary

    folds = [({"mae": m}, {"ridge": {"mae": 2.0}}) for m in (3.0, 4.0)]
    backtest = {**backtest_summary(folds, ["a", "b"]), "notes": ["correction dropped at leads 1-2", None]}
    result = {"pipeline": "p", "preset": "tiny", "seconds": 1.0, "metrics": folds[-1][0], "baseline": folds[-1][1],
              "backtest": backtest, "training": {"note": "correction kept at lead 1, dropped at lead 2"},
              "export": "out/p/1"}
    lines = run_summary(result, (Headline("mae", "MAE", "MW"),)).splitlines()
    assert "training: correction kept at lead 1, dropped at lead 2" in lines
    assert "fold 1: correction dropped at leads 1-2" in lines
    assert not any(line.startswith("fold 2:") for line in lines)  # a fold whose fit noted nothing
    del result["training"], backtest["notes"]
    assert not any(line.startswith(("training:", "fold ")) for line in run_summary(result).splitlines())


def test_run_summary_keeps_a_long_metric_name_apart_from_its_neighbours():
    result = {"pipeline": "p", "preset": "tiny", "seconds": 1.0, "export": "out/p/1",
              "metrics": {"mase": 0.175, "interval_coverage": 0.798, "pinball": 109.2},
              "baseline": {"ridge": {"mase": 0.176, "interval_coverage": None, "pinball": None}}}
    header, model, ridge = run_summary(result).splitlines()[1:4]
    assert header.split() == ["mase", "interval_coverage", "pinball"]
    assert model.split() == ["model", "0.175", "0.798", "109.2"]
    assert ridge.split() == ["ridge", "0.176", "n/a", "n/a"]
    # Each value ends where its column's name ends.
    for name, value in (("interval_coverage", "0.798"), ("pinball", "109.2")):
        assert model.index(value) + len(value) == header.index(name) + len(name)


def test_run_summary_shows_headlines_in_units_against_baselines_named_otherwise_and_nested_results():
    # The defects of issue 22: a dict metric crashed the summary, a metric with "/" vanished, and
    # baselines computed under other names showed n/a.
    result = {"pipeline": "p", "preset": "tiny", "seconds": 1.0, "export": "out/p/1",
              "metrics": {"greedy_cer": 0.93, "test/beam_bleu4": 12.5, "parameters": 72384,
                          "val_bleu_by_length_penalty": {"0.0": 11.0, "0.6": 12.25}, "samples/test": [{"a": 1}]},
              "baseline": {"most_frequent_sentence": {"cer": 0.8}, "empty": {}},
              "data": {"source": "mine.csv", SPLIT_COUNTS: {"unit": "clips", "train": 19, "val": 2, "test": 3},
                       VOCABULARIES: {"words": {"added": ["temple", "flower"], "size": 37, "oov_rate": 0.05}}},
              "finetuned_from": "out/p/1", "metrics_before": {"greedy_cer": 1.0}}
    headlines = (Headline("greedy_cer", "CER", "%", 100.0, "cer", higher_is_better=False),
                 Headline("test/beam_bleu4", "BLEU-4"))
    lines = run_summary(result, headlines).splitlines()
    assert lines[0] == "p (fine-tuned from out/p/1) in 1.0 s"
    assert lines[1].split() == ["CER", "(%)", "BLEU-4"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:7]}
    assert rows["before"] == ["finetune", "100", "n/a"] and rows["model"] == ["93", "12.5"]
    assert rows["most_frequent_sentence"] == ["80", "n/a"] and rows["empty"] == ["n/a", "n/a"]
    assert "other metrics: parameters 72384" in lines
    assert "val_bleu_by_length_penalty: 0.0 11, 0.6 12.25" in lines
    assert "split: 19 train / 2 validation / 3 test clips" in lines
    assert "words: 37 in all; 2 added (temple, flower); 5% of test words unknown" in lines
    assert lines[-1] == "export: out/p/1"

def test_run_summary_prints_results_per_name_as_a_table_and_long_names_on_their_own_lines():
    voices = {"awb": {"beam_cer": 0.168, "utterances": 44}, "slt": {"beam_cer": 0.3081, "utterances": 45}}
    long_name = "Festival cmu_us_slt_arctic_hts (held-out voice) " + "x" * 80
    result = {"pipeline": "p", "preset": "tiny", "seconds": 1.0, "export": "out/p/1",
              "metrics": {"cer": 0.2, "per_voice": voices, "test_sets": {long_name: {"beam_cer": 0.2427}},
                          "per_tag": {"rock": 0.9, "jazz": 0.8}}}
    lines = run_summary(result).splitlines()
    start = lines.index(next(line for line in lines if line.startswith("per_voice:")))
    header, awb, slt = lines[start: start + 3]
    assert header.split() == ["per_voice:", "beam_cer", "utterances"]
    assert awb.split() == ["awb", "0.168", "44"] and slt.split() == ["slt", "0.3081", "45"]
    for row in (awb, slt):  # each number ends where its column's name ends
        assert row.rstrip().endswith(row.split()[-1]) and len(row) == len(header)
    assert awb.index("0.168") + len("0.168") == header.index("beam_cer") + len("beam_cer")
    start = lines.index("test_sets:")
    assert lines[start + 1].split() == ["beam_cer"] and lines[start + 2] == f"  {long_name}"
    assert lines[start + 3].split() == ["0.2427"]
    assert "per_tag: rock 0.9, jazz 0.8" in lines  # numbers per name, not records: one wrapped line
