"""The run folder, ``runs/NAME/VERSION``: TensorBoard logs, what the run saved, and its report.

A run writes its TensorBoard events into a hidden pending folder (``runs/NAME/.run-KEY``, one per
command, so a resumed run continues the same logs). Once the export is in place, ``finish``
saves the result and the report data, logs the test metrics and every report figure to
TensorBoard, builds ``report.html`` and renames the folder after the export's version. The
folder is never inside the export: TF Serving and ``finetune`` read none of it.

Layout::

    runs/NAME/VERSION/
        train/, validation/   Keras' TensorBoard callback: loss, learning rate, metrics per epoch
        test/                 the test metrics (and each baseline's) and the figures, at the last epoch
        result.json           what ``seqapps run`` returned, with the resolved config
        report_data.npz       the arrays the pipeline's figures are drawn from (``Pipeline.report_data``)
        report.html           one self-contained page (``seqapps report`` rebuilds it)
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from seqapps.errors import DataError
from seqapps.report.document import Figure, Section, Table, Text, figures_of, render_html

if TYPE_CHECKING:
    from seqapps.export_format import ExportInfo

RESULT_FILE = "result.json"
REPORT_DATA_FILE = "report_data.npz"
REPORT_FILE = "report.html"
TEST_LOGS = "test"
PENDING_PREFIX = ".run-"


def default_logdir(beside: Path) -> Path:
    """``runs`` in the folder that holds the export root (``saved_models`` -> ``runs``): ``--logdir``'s default.

    Args:
        beside: the export root's parent folder.
    """
    return Path(beside) / "runs"


def logdir_of_export(export: Path) -> Path:
    """``default_logdir`` for an export ``ROOT/NAME/VERSION``: ``runs`` beside ``ROOT`` (relative where under the cwd)."""
    beside = Path(export).absolute().parents[2]
    return default_logdir(beside.relative_to(Path.cwd()) if beside.is_relative_to(Path.cwd()) else beside)


def pending_folder(logdir: Path, pipeline: str, key: str) -> Path:
    """The folder a run logs into until its export exists: ``logdir/pipeline/.run-KEY``.

    Args:
        logdir: ``--logdir`` (``runs``).
        pipeline: the pipeline's name.
        key: what names the command (the checkpoint folder's digest), so that a resumed run finds it.
    """
    return Path(logdir) / pipeline / f"{PENDING_PREFIX}{key}"


def save_report_data(folder: Path, arrays: Mapping[str, Any]) -> None:
    """Saves ``Pipeline.report_data``'s arrays (flat names; strings as Unicode arrays, no pickles)."""
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{REPORT_DATA_FILE}.partial"
    with open(partial, "wb") as stream:
        np.savez_compressed(stream, **{name: np.asarray(value) for name, value in arrays.items()})
    os.replace(partial, folder / REPORT_DATA_FILE)


def load_report_data(folder: Path) -> dict[str, np.ndarray]:
    """The report data a run saved; empty where it saved none."""
    path = Path(folder) / REPORT_DATA_FILE
    if not path.is_file():
        return {}
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _flat_numbers(value: dict[str, Any]) -> list[tuple[str, float]]:
    """The numbers of a nested dict as ``(dotted key, float)`` pairs, in order (``summary.flat_numbers``)."""
    from seqapps.summary import flat_numbers

    return [(key, float(number)) for key, number in flat_numbers(value)]


def _headline_section(result: dict[str, Any], pipeline: Any) -> Section:
    from seqapps.summary import headline_rows, headlines_of

    headlines = headlines_of(result, pipeline.headline_metrics)
    baselines = result.get("baseline", {})
    rows = headline_rows(result)
    table = Table(["", *(h.title() for h in headlines)],
                  [[name, *(h.value(values, baseline=name in baselines) for h in headlines)]
                   for name, values in rows.items()],
                  caption="the model on the test split, beside every baseline")
    verb = f"fine-tuned from {result['finetuned_from']}" if "finetuned_from" in result else \
        f"{result.get('preset', '?')} preset"
    facts = Text(f"{result['pipeline']} ({verb}), {result.get('seconds', '?')} s; export: {result.get('export')}")
    return Section("Headline metrics", [facts, table], anchor="headline-metrics")


def _config_section(result: dict[str, Any]) -> Section:
    import yaml

    text = yaml.safe_dump(result.get("config", {}), sort_keys=False) or "(not saved)"
    return Section("Configuration", [Text(text, preformatted=True)], anchor="configuration")


def _data_section(result: dict[str, Any]) -> Section:
    import yaml

    data = result.get("data", {})
    blocks: list[Any] = []
    counts = data.get("split_counts")
    if counts:
        blocks.append(Table(["split", counts.get("unit", "items")],
                            [[split, counts[split]] for split in ("train", "val", "test") if split in counts]))
    rest = {key: value for key, value in data.items() if key != "split_counts"}
    if rest:
        blocks.append(Text(yaml.safe_dump(rest, sort_keys=False, allow_unicode=True, width=100), preformatted=True))
    return Section("Data", blocks or [Text("(no data report)")], anchor="data")


def epoch_curve(history: Mapping[str, Sequence[float | None]], key: str) -> tuple[list[int], list[float]]:
    """One logged value over training: ``(epochs from 1, values)``, epochs without it left out.

    Args:
        history: ``result["training"]["history"]`` (key -> one value or None per epoch).
        key: the logged name (``loss``, ``val_loss``, ``val_bpc``).
    """
    points = [(epoch + 1, value) for epoch, value in enumerate(history.get(key) or []) if value is not None]
    return [x for x, _ in points], [y for _, y in points]


def last_epoch_table(result: dict[str, Any], metrics: Sequence[tuple[str, str]]) -> Table:
    """A pipeline's epoch metrics at the last epoch beside the same metrics on the test split.

    Args:
        result: the run's result (``training.history`` holds ``val_KEY``; ``metrics`` holds ``KEY``).
        metrics: ``(key, label)`` of each metric, a row each (n/a where the run did not log it).
    """
    history = (result.get("training") or {}).get("history") or {}
    rows = [[label, (epoch_curve(history, f"val_{key}")[1] or [None])[-1], (result.get("metrics") or {}).get(key)]
            for key, label in metrics]
    return Table(["metric", "validation, last epoch", "test"], rows,
                 caption="validation: the first examples of the split, measured after each epoch")


def _training_section(result: dict[str, Any]) -> Section:
    from seqapps.report import plots

    training = result.get("training") or {}
    history: dict[str, list[float | None]] = training.get("history") or {}
    epochs = training.get("epochs_run", 0)
    blocks: list[Any] = [Text(f"{epochs} epoch{'' if epochs == 1 else 's'} in {training.get('seconds', '?')} s"
                              + (f", resumed after epoch {training['resumed_from_epoch']}"
                                 if training.get("resumed_from_epoch") else "")
                              + (f"; best validation loss {training['best_val_loss']:.4g}"
                                 if isinstance(training.get("best_val_loss"), float) else ""))]

    if history.get("loss"):
        blocks.append(plots.line_chart("training_loss", "loss per epoch",
                                       {name: epoch_curve(history, key)
                                        for name, key in (("training", "loss"), ("validation", "val_loss"))
                                        if history.get(key)}, "epoch", "loss", markers=True))
    if history.get("learning_rate"):
        blocks.append(plots.line_chart("learning_rate", "learning rate per epoch",
                                       {"learning rate": epoch_curve(history, "learning_rate")}, "epoch",
                                       "learning rate", log_y=True, markers=True))
    metrics = [key for key in history if key.startswith("val_") and key != "val_loss"]
    for key in metrics:
        blocks.append(plots.line_chart(f"epoch_{key}", f"validation {key[4:]} per epoch",
                                       {key[4:]: epoch_curve(history, key)}, "epoch", key[4:], markers=True))
    return Section("Training", blocks, anchor="training")


def _metrics_section(result: dict[str, Any]) -> Section:
    rows = [["model", key, value] for key, value in _flat_numbers(result.get("metrics", {}))]
    for name, values in (result.get("baseline") or {}).items():
        rows += [[name, key, value] for key, value in _flat_numbers(values)]
    return Section("All test metrics", [Table(["model or baseline", "metric", "value"], rows)], anchor="metrics")


def sections(result: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> list[Section]:
    """Every section of a run's report: the shared ones, then the pipeline's own.

    Args:
        result: the run's ``result.json``.
        arrays: its report data.
    """
    from seqapps.pipeline import REGISTRY

    pipeline = REGISTRY.get(result["pipeline"])()
    own = pipeline.report_sections(result, arrays)
    return [_headline_section(result, pipeline), _config_section(result), _data_section(result),
            _training_section(result), *own, _metrics_section(result)]


def write_report(folder: Path, built: Sequence[Section], title: str) -> Path:
    """Writes ``report.html`` into ``folder`` whole (a temporary file renamed); returns its path."""
    page = render_html(title, built)
    partial = folder / f"{REPORT_FILE}.partial"
    partial.write_text(page, encoding="utf-8")
    os.replace(partial, folder / REPORT_FILE)
    return folder / REPORT_FILE


def log_test_summaries(folder: Path, result: dict[str, Any], figures: Sequence[Figure]) -> None:
    """Logs the test metrics, each baseline's, and the figures to TensorBoard (``folder/test``).

    Scalars are tagged ``test/KEY`` and ``baseline/NAME/KEY``; images by figure name; all at the
    last epoch's step (Keras logs epoch e, from 0, at step e), so TensorBoard shows them beside the
    training curves' last point.
    """
    import tensorflow as tf

    step = max(int((result.get("training") or {}).get("epochs_run") or 0) - 1, 0)
    writer = tf.summary.create_file_writer(str(folder / TEST_LOGS))
    with writer.as_default():
        for key, value in _flat_numbers(result.get("metrics", {})):
            tf.summary.scalar(f"test/{key}", value, step=step)
        for name, values in (result.get("baseline") or {}).items():
            for key, value in _flat_numbers(values):
                tf.summary.scalar(f"baseline/{name}/{key}", value, step=step)
        for figure in figures:
            image = tf.io.decode_png(figure.png, channels=3)
            tf.summary.image(figure.name, image[tf.newaxis], step=step, description=figure.caption)
    writer.close()


def _title(result: dict[str, Any]) -> str:
    return f"seqapps {result['pipeline']}: " + (f"fine-tuned from {result['finetuned_from']}"
                                               if "finetuned_from" in result else f"{result.get('preset')} preset")


def finish(pending: Path, result: dict[str, Any], config: dict[str, Any]) -> Path:
    """Completes a run folder once its export exists, and names it after the export's version.

    Saves ``result.json`` (with ``config``), logs the test metrics and figures to TensorBoard and
    builds ``report.html``. A report that cannot be built is told in one line on stderr; the
    logs and the result are kept all the same.

    Args:
        pending: the folder the run logged into (``pending_folder``), holding its report data.
        result: the run's result; its ``export`` names the version.
        config: the resolved config, as a dict.

    Returns:
        The final folder ``runs/NAME/VERSION``: a folder of that name left by an export that no
        longer exists is replaced; one of another export that exists (another export root logging
        into the same ``runs``) is kept, and this run's is ``VERSION-2`` (``-3``, ...).
    """
    pending.mkdir(parents=True, exist_ok=True)
    saved = {**result, "config": config}
    (pending / RESULT_FILE).write_text(json.dumps(saved, indent=2, default=str), encoding="utf-8")
    built: list[Section] | None = None
    try:
        built = sections(saved, load_report_data(pending))
    except Exception as error:  # the report is never required: the run, its logs and its export stand
        print(f"seqapps: report not built ({type(error).__name__}: {error}); the run and its export are complete",
              file=sys.stderr)
    try:
        log_test_summaries(pending, saved, figures_of(built or []))  # the test metrics even without a report
        if built is not None:
            write_report(pending, built, _title(saved))
    except Exception as error:
        print(f"seqapps: report not written ({type(error).__name__}: {error}); the run and its export are complete",
              file=sys.stderr)
    final = _free_name(pending.parent, Path(result["export"]))
    if final.exists():
        shutil.rmtree(final)
    os.rename(pending, final)
    return final


def _free_name(folder: Path, export: Path) -> Path:
    """``folder/VERSION`` for the export ``.../VERSION``, unless a run folder of another export that still
    exists holds that name (two export roots logging into one ``runs``): then ``VERSION-2``, ``VERSION-3``, ...
    """
    candidates = [folder / export.name, *(folder / f"{export.name}-{n}" for n in range(2, 1000))]
    for candidate in candidates:
        saved = candidate / RESULT_FILE
        try:
            other = Path(json.loads(saved.read_text(encoding="utf-8"))["export"]) if saved.is_file() else None
        except (OSError, ValueError, KeyError, TypeError):
            other = None
        if other is None or not other.is_dir() or other.resolve() == export.resolve():
            return candidate  # free, or left by an export that no longer exists, or this export's own
    raise OSError(f"{folder}: no free run folder name for {export}")


def run_folder_of(info: "ExportInfo", logdir: str | Path | None = None) -> Path:
    """An export's run folder, ``logdir/NAME/VERSION``; made from the export's metrics and config where it is missing.

    Args:
        info: the export (``seqapps.export_format.read_export``).
        logdir: where the run folders are (default: ``logdir_of_export``).
    """
    root = Path(logdir) if logdir else logdir_of_export(info.path)
    folder = root / info.pipeline / info.path.name
    if not (folder / RESULT_FILE).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        saved = {"pipeline": info.pipeline, "preset": info.preset, **info.metrics, "export": str(info.path),
                 "config": info.config}
        (folder / RESULT_FILE).write_text(json.dumps(saved, indent=2, default=str), encoding="utf-8")
    return folder


def rebuild(path: str | Path, logdir: str | Path | None = None) -> Path:
    """Builds ``report.html`` again from what a run saved (``seqapps report``).

    Args:
        path: a run folder (``runs/NAME/VERSION``) or an export (``saved_models/NAME/VERSION``);
            for an export, its run folder under ``logdir``; where there is none, one is made from
            the export's saved metrics and config (without the pipeline's figures, whose data
            only the run saved).
        logdir: where an export's run folder is (default: ``logdir_of_export``).

    Returns:
        The report's path.

    Raises:
        ExportError: ``path`` is neither a run folder nor an export.
        DataError: the run folder's ``result.json`` is not what a run saves.
    """
    from seqapps.export_format import read_export

    folder = Path(path)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder (expected a run folder runs/NAME/VERSION or an export "
                        "saved_models/NAME/VERSION)")
    if not (folder / RESULT_FILE).is_file():
        folder = run_folder_of(read_export(folder), logdir)  # read_export raises ExportError naming what is missing
    try:
        saved = json.loads((folder / RESULT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DataError(f"{folder / RESULT_FILE}: expected the JSON a run saves ({error})") from None
    return write_report(folder, sections(saved, load_report_data(folder)), _title(saved))
