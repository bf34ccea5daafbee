"""A person's path through every registered pipeline, on the command line and without ``--json``.

For each pipeline: ``seqapps run NAME --preset tiny`` (the session's ``tiny_exports``), then
``seqapps predict`` on every signature of that export with inputs of the pipeline's own kind,
then ``seqapps finetune`` on a small data set in the pipeline's README format
(``Pipeline.write_sample_data``). A new pipeline is covered with no new test code: it declares
its headline metrics and writes its sample data.
"""
import json
from pathlib import Path

import pytest
import tensorflow as tf

from seqapps import cli
from seqapps.export_format import ASSETS_EXTRA, EXAMPLES_INPUT
from seqapps.pipeline import REGISTRY, SPLIT_COUNTS, VOCABULARIES
from seqapps.summary import headlines_of

pytestmark = [pytest.mark.large, pytest.mark.long_fixtures]

#: the share of a small data set that must reach training (the issue's floor)
MIN_TRAIN_SHARE = 0.6


def _exported(export: str | Path) -> dict:
    return json.loads((Path(export) / ASSETS_EXTRA / "metrics.json").read_text())


def _no_traceback(*texts: str) -> None:
    for text in texts:
        assert "Traceback" not in text, text[-3000:]


@pytest.fixture(scope="module")
def sample_data(tmp_path_factory) -> dict:
    """``{name: (data path or None, predict inputs)}`` for every pipeline, written once."""
    root = tmp_path_factory.mktemp("user_data")
    found = {}
    for name in REGISTRY.names():
        folder = root / name
        folder.mkdir()
        found[name] = REGISTRY.get(name)().write_sample_data(folder, seed=3)
    return found


@pytest.mark.parametrize("name", REGISTRY.names())
def test_run_prints_the_headline_metrics_beside_every_baseline_and_the_export(tiny_exports, name):
    run = tiny_exports[name]
    _no_traceback(run["out"], run["err"])
    assert run["code"] == 0, run["err"]
    lines = run["out"].strip().splitlines()
    assert lines[-1] == f"export: {run['export']}"
    assert lines[-2].startswith(f"report: {run['run_folder']}/report.html (TensorBoard: tensorboard --logdir ")
    result = _exported(run["export"])
    headlines = headlines_of(result, REGISTRY.get(name).headline_metrics)
    assert headlines and all(h.key in result["metrics"] for h in REGISTRY.get(name).headline_metrics
                             if not h.optional), \
        "a declared headline metric is missing from the run's metrics"
    header = next(line for line in lines if headlines[0].title() in line)
    assert all(h.title() in header for h in headlines)
    table = lines[lines.index(header) + 1:]
    for row_name in ("model", *result["baseline"]):
        row = next(line for line in table if line.split()[0] == row_name)
        assert len(row.split()) == 1 + len(headlines), row  # a value or n/a under every column
    counts = result["data"].get(SPLIT_COUNTS)
    assert counts and f"{counts['train']} train / {counts['val']} validation / {counts['test']} test" in run["out"]


@pytest.mark.parametrize("name", REGISTRY.names())
def test_predict_formats_every_signature_and_names_each_input(tiny_exports, sample_data, name, capsys):
    export = tiny_exports[name]["export"]
    _, inputs = sample_data[name]
    loaded = tf.saved_model.load(export)
    signatures = sorted(loaded.signatures)
    assert "serving_default" in signatures
    for signature in signatures:
        code = cli.main(["predict", export, *inputs, "--signature", signature])
        captured = capsys.readouterr()
        _no_traceback(captured.out, captured.err)
        assert code == 0, f"{signature}: {captured.err}"
        for given in inputs:
            assert Path(given).name in captured.out, f"{signature} does not name its input {given!r}"
        if list(loaded.signatures[signature].structured_input_signature[1]) == [EXAMPLES_INPUT]:
            # TF Serving's Classify/Regress answer, from the files sent as tf.Examples
            assert ("classes:" in captured.out and "scores:" in captured.out) or "outputs:" in captured.out


@pytest.mark.parametrize("name", REGISTRY.names())
def test_finetune_on_a_small_folder_trains_on_most_of_it_and_adds_what_is_new(tiny_finetune, name):
    tuned = tiny_finetune(name)
    if tuned["data"] is None:  # a pipeline that generates its data refuses --data in one line
        err = tuned["err"]
        assert tuned["code"] == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
        return
    assert tuned["code"] == 0, tuned["err"]
    assert tuned["err"] == "", tuned["err"]  # no warning of TensorFlow's (a function traced again and again)
    _no_traceback(tuned["out"])
    new_export = tuned["out"].strip().splitlines()[-1].removeprefix("export: ")
    assert new_export == tuned["export"] and Path(new_export).name == "2"
    report = _exported(new_export)["data"]
    counts = report[SPLIT_COUNTS]
    assert counts["train"] >= MIN_TRAIN_SHARE * (counts["train"] + counts["val"] + counts["test"]), counts
    assert counts["val"] >= 1 and counts["test"] >= 1
    assert f"{counts['train']} train / {counts['val']} validation / {counts['test']} test" in tuned["out"]
    before = _exported(tuned["from"])["data"].get(VOCABULARIES)
    if before:  # a pipeline with words, characters or tags adds the sample data's new ones and says so
        grown = {kind: facts for kind, facts in report[VOCABULARIES].items() if facts.get("added")}
        assert grown, report[VOCABULARIES]
        for kind, facts in grown.items():
            assert f"{kind}: " in tuned["out"] and f"{len(facts['added'])} added" in tuned["out"]
