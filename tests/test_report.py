"""What a run leaves to look at: its TensorBoard events, the report's size bound, a report that fails,
and ``seqapps report`` rebuilding a report from a run folder or from an export alone.

The runs are the session's ``tiny_exports`` (read only: a test that writes works on a copy); one
more tiny ``copy_task`` run has a pipeline whose ``report_sections`` raises.
"""
import contextlib
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf

from seqapps import cli
from seqapps.export_format import ASSETS_EXTRA
from seqapps.pipeline import REGISTRY
from seqapps.report import run_folder
from seqapps.report.document import Figure, Section, Text, render_html
from tests.tensorboard_events import read_events, scalars

pytestmark = pytest.mark.large

#: the sections every report has, by HTML id
SHARED_ANCHORS = ["headline-metrics", "configuration", "data", "training", "metrics"]


def _flat(value: Any, prefix: str = "") -> dict[str, float]:
    """A nested dict's numbers by dotted key (the reference for the ``test/KEY`` tags)."""
    if isinstance(value, dict):
        return {key: number for name, item in value.items() for key, number in _flat(item, f"{prefix}{name}.").items()}
    return {prefix[:-1]: float(value)} if isinstance(value, (int, float)) and not isinstance(value, bool) else {}


def _float32(values: Any) -> list[np.float32]:
    return [np.float32(value) for value in values]


def _run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def _outline(page: str) -> tuple[list[str], list[str], str]:
    """A report page's section ids, figure names, and its text with every inline image cut out."""
    return (re.findall(r'<section id="([^"]+)"', page), re.findall(r'<figure id="figure-([^"]+)"', page),
            re.sub(r'src="data:image/png;base64,[^"]*"', 'src=""', page))


@pytest.mark.parametrize("name", REGISTRY.names())
def test_tensorboard_events_hold_every_epoch_the_test_metrics_and_the_report_figures(tiny_exports, name):
    run = tiny_exports[name]
    assert run["code"] == 0, run["err"]
    folder = Path(run["run_folder"])
    result = json.loads((folder / run_folder.RESULT_FILE).read_text())
    exported = json.loads((Path(run["export"]) / ASSETS_EXTRA / "metrics.json").read_text())
    training = result["training"]
    epochs = list(range(training["epochs_run"]))  # Keras logs epoch e (from 0) at step e

    train, validation = scalars(folder / "train", "epoch_loss"), scalars(folder / "validation", "epoch_loss")
    assert list(train) == epochs and list(validation) == epochs
    assert _float32(train.values()) == _float32(training["loss_history"])  # Keras' float32 logs, both ways
    assert _float32(validation.values()) == _float32(training["val_loss_history"])
    learning_rate = scalars(folder / "train", "epoch_learning_rate")
    assert _float32(learning_rate.values()) == _float32(training["history"]["learning_rate"])
    for key, values in training["history"].items():  # the pipeline's epoch_metrics, logged as val_NAME
        if key.startswith("val_") and key != "val_loss":
            logged = scalars(folder / "validation", f"epoch_{key[4:]}")
            assert _float32(logged.values()) == _float32(v for v in values if v is not None), key

    test = read_events(folder / "test")
    expected = _flat(exported["metrics"])
    assert expected and {tag[5:] for tag in test if tag.startswith("test/")} == set(expected)
    for key, value in expected.items():
        assert scalars(folder / "test", f"test/{key}") == {epochs[-1]: np.float32(value)}, key
    for baseline, values in exported["baseline"].items():
        for key, value in _flat(values).items():
            assert list(scalars(folder / "test", f"baseline/{baseline}/{key}").values()) == [np.float32(value)]

    images = {tag: by_step for tag, by_step in test.items()
              if next(iter(by_step.values()))[0].metadata.plugin_data.plugin_name == "images"}
    figures = _outline((folder / run_folder.REPORT_FILE).read_text())[1]
    assert sorted(images) == sorted(figures) and "training_loss" in images  # the report's figures, each once
    for tag, by_step in images.items():
        width, height, png = next(iter(by_step.values()))[0].tensor.string_val
        decoded = tf.io.decode_png(png).numpy()
        assert png.startswith(b"\x89PNG") and decoded.shape[:2] == (int(height), int(width)), tag


def test_a_report_over_the_size_bound_leaves_out_its_largest_figures_until_it_fits():
    rng = np.random.default_rng(0)  # random bytes: base64 makes each 4/3 as large, whatever they are

    def figure(name: str, size: int) -> Figure:
        return Figure(name, rng.integers(0, 256, size, dtype=np.uint8).tobytes(), f"{name} figure")

    sections = [Section("One", [Text("first"), figure("large", 300_000), figure("small", 50_000)], anchor="one"),
                Section("Two", [figure("medium", 200_000)], anchor="two")]
    whole = render_html("bounded", sections, max_bytes=10**7)
    assert len(whole) > 733_000  # the three figures: 4/3 * 550 kB
    page = render_html("bounded", sections, max_bytes=500_000)
    assert len(page.encode("utf-8")) <= 500_000
    # 400 kB + 267 kB + 67 kB: leaving out the largest alone brings the page to about 333 kB
    assert _outline(page)[:2] == (["one", "two"], ["small", "medium"])
    assert "(figure &#x27;large&#x27; left out: the report is kept under 0.477 MB)" in page
    tight = render_html("bounded", sections, max_bytes=100_000)
    assert _outline(tight)[1] == ["small"] and len(tight.encode("utf-8")) <= 100_000
    bare = render_html("bounded", sections, max_bytes=1_000)  # the text alone is larger: no figure is left
    assert _outline(bare)[1] == [] and "first" in bare


def test_a_pipeline_whose_report_fails_still_exports_and_says_so_in_one_line(monkeypatch, tmp_path):
    def broken(self, result, arrays):
        raise RuntimeError("no picture today")

    monkeypatch.setattr(REGISTRY.get("copy_task"), "report_sections", broken)
    code, out, err = _run("run", "copy_task", "--preset", "tiny", "--out", str(tmp_path / "saved_models"))
    assert code == 0, err
    assert err.splitlines() == ["seqapps: report not built (RuntimeError: no picture today); "
                                "the run and its export are complete"]
    export = tmp_path / "saved_models" / "copy_task" / "1"
    assert out.strip().splitlines()[-1] == f"export: {export}" and "report:" not in out
    assert (export / "saved_model.pb").is_file()
    folder = tmp_path / "runs" / "copy_task" / "1"  # the logs and the result are kept; no page
    assert (folder / run_folder.RESULT_FILE).is_file() and not (folder / run_folder.REPORT_FILE).exists()
    assert scalars(folder / "train", "epoch_loss")
    metrics = json.loads((export / ASSETS_EXTRA / "metrics.json").read_text())["metrics"]
    assert list(scalars(folder / "test", "test/bpc").values()) == pytest.approx([metrics["bpc"]], rel=1e-6)  # float32


def test_a_run_folder_keeps_its_name_from_another_existing_export_and_replaces_a_gone_ones(tmp_path):
    def left_by(export: Path) -> Path:
        folder = tmp_path / "runs" / "copy_task" / export.name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / run_folder.RESULT_FILE).write_text(json.dumps({"export": str(export)}))
        return folder

    runs = tmp_path / "runs" / "copy_task"
    ours, theirs = tmp_path / "a" / "copy_task" / "1", tmp_path / "b" / "copy_task" / "1"
    ours.mkdir(parents=True)
    assert run_folder._free_name(runs, ours) == runs / "1"  # nothing there yet
    left_by(theirs)  # another export root's run folder; its export is gone
    assert run_folder._free_name(runs, ours) == runs / "1"
    theirs.mkdir(parents=True)  # now it exists: its run folder is kept
    assert run_folder._free_name(runs, ours) == runs / "1-2"


@pytest.mark.parametrize("name", REGISTRY.names())
def test_seqapps_report_rebuilds_a_run_folder_with_the_same_sections_and_figures(tiny_exports, tmp_path, name):
    assert tiny_exports[name]["code"] == 0, tiny_exports[name]["err"]
    folder = tmp_path / "runs" / name / "1"
    shutil.copytree(tiny_exports[name]["run_folder"], folder)
    built = (folder / run_folder.REPORT_FILE).read_text()
    (folder / run_folder.REPORT_FILE).unlink()
    code, out, err = _run("report", str(folder))
    assert (code, out, err) == (0, f"report: {folder / run_folder.REPORT_FILE}\n", "")
    rebuilt = (folder / run_folder.REPORT_FILE).read_text()
    sections, figures, text = _outline(built)
    assert sections[:4] == SHARED_ANCHORS[:4] and sections[-1] == SHARED_ANCHORS[-1] and "training_loss" in figures
    assert _outline(rebuilt) == (sections, figures, text)  # tables and texts to the letter; figures by name


@pytest.mark.parametrize("name", REGISTRY.names())
def test_seqapps_report_on_an_export_without_its_run_folder_builds_one_from_its_metrics(tiny_exports, tmp_path, name):
    assert tiny_exports[name]["code"] == 0, tiny_exports[name]["err"]
    export = tmp_path / "saved_models" / name / "1"  # a copy of the export, and no run folder beside it
    shutil.copytree(tiny_exports[name]["export"], export)
    result = json.loads((export / ASSETS_EXTRA / "metrics.json").read_text())
    folder = tmp_path / "runs" / name / "1"  # runs beside saved_models, as a run puts it
    assert not folder.exists()
    code, out, err = _run("report", str(export))
    assert (code, out, err) == (0, f"report: {folder / run_folder.REPORT_FILE}\n", "")
    page = (folder / run_folder.REPORT_FILE).read_text()
    sections, figures, text = _outline(page)
    assert sections[:4] == SHARED_ANCHORS[:4] and sections[-1] == SHARED_ANCHORS[-1]
    assert "training_loss" in figures  # the training history is in metrics.json; the pipeline's arrays are not
    metrics = re.sub(r"<td[^>]*>", "<td>", text[text.index('<section id="metrics">'):])  # cells without their class
    for key, value in _flat(result["metrics"]).items():
        assert f"<tr><td>model</td><td>{key}</td><td>{value:.4g}</td></tr>" in metrics, key
