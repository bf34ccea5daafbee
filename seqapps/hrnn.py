"""The hierarchy the HRNN pipelines share (copy_task, pixel_mnist, hrnn_char_lm): an ``HRNNConfig`` as a layer,
and the report sections they share.

The layers know no config (``seqapps.layers`` imports only layers and Keras); this is where a
config's hierarchy settings become a ``seqapps.layers.hierarchical_rnn.DecoupledHRNN``. Each
pipeline's report names the training mode beside its task metric per epoch, and shows the memory
bench (``seqapps bench hrnn --out runs/bench/hrnn.json``) when it was run before.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import keras
import numpy as np

from seqapps.bench import hrnn as memory_bench
from seqapps.config import HRNNConfig
from seqapps.layers.hierarchical_rnn import DecoupledHRNN
from seqapps.report import plots, run_folder
from seqapps.report.document import Section, Table, Text

#: ``HRNNConfig.cell`` -> the Keras cell of each level.
CELLS = {"lstm": keras.layers.LSTMCell, "gru": keras.layers.GRUCell}
#: ``HRNNConfig.mode`` -> what it trains with, as the reports name it.
MODE_TITLES = {"hrnn": "HRNN, true gradients (full backpropagation through time)",
               "gr_hrnn": "gr-HRNN, restricted gradients without decoders",
               "decoupled": "decoupled HRNN, restricted gradients plus the decoders' local losses",
               "mr_hrnn": "mr-HRNN, true gradients truncated to the decoupled model's memory"}
#: the prefix of the memory bench's arrays in a run's report data
BENCH_PREFIX = "bench/"


def build_hrnn(config: HRNNConfig, output_units: int, aux_loss: str) -> DecoupledHRNN:
    """Returns the ``DecoupledHRNN`` that ``config`` describes, with a linear head of ``output_units`` logits.

    Args:
        config: the hierarchy's settings.
        output_units: classes per step.
        aux_loss: the level-1 decoder's loss ("mse" or "categorical_crossentropy").

    Returns:
        An unbuilt layer.
    """
    beta = config.beta  # None: the layer's default for the mode
    if isinstance(beta, list):
        beta = [float(b) for b in beta] if len(beta) > 1 else float(beta[0])
    return DecoupledHRNN([CELLS[config.cell](units) for units in config.units], periods=config.period_list(),
                         mode=config.mode, beta=beta,
                         aux_hidden_units=config.aux_hidden_units, aux_loss=aux_loss,
                         output_units=output_units, seed=config.seed, name="hrnn")


def bench_report_data(export_path: Path) -> dict[str, np.ndarray]:
    """The memory bench's rows, when ``seqapps bench hrnn --out runs/bench/hrnn.json`` wrote them before the run.

    Args:
        export_path: the run's export (``saved_models/NAME/VERSION``); the file is looked for in the
            default ``--logdir`` beside its export root (``run_folder.logdir_of_export``: ``runs/bench/hrnn.json``).

    Returns:
        ``{"bench/FIELD": float array, one value per row}`` for ``memory_bench.ROW_FIELDS`` and
        ``bench/config`` (its settings as JSON); empty without the file.

    Raises:
        DataError: the file is there but is not the bench's result.
    """
    result = memory_bench.read_result(run_folder.logdir_of_export(export_path) / memory_bench.RESULT_IN_LOGDIR)
    if result is None:
        return {}
    rows = result["results"]
    arrays = {f"{BENCH_PREFIX}{field}": np.array([row[field] for row in rows], np.float64)
              for field in memory_bench.ROW_FIELDS}
    return {**arrays, f"{BENCH_PREFIX}config": np.array(json.dumps(result.get("config", {})))}


def mode_and_bench_sections(result: dict[str, Any], arrays: Mapping[str, np.ndarray],
                            metrics: Sequence[tuple[str, str]],
                            levels: Mapping[str, float] | None = None) -> list[Section]:
    """The sections of every HRNN pipeline's report: the task metric per epoch under the mode's name, the memory bench.

    Args:
        result: the run's result (its config names the mode; ``training.history`` holds ``val_KEY``).
        arrays: the report data (``bench_report_data``'s, when the bench was run).
        metrics: ``(key, label)`` of the epoch metrics, all in the table; the first is drawn per epoch,
            beside each baseline's test value of it.
        levels: more labelled values to draw as flat lines on that chart (a threshold).

    Returns:
        The sections ``task-metric`` and ``memory-bench``.
    """
    config = result.get("config") or {}
    mode = str(config.get("mode", "?"))
    beta = config.get("beta")
    blocks: list[Any] = [Text(f"Mode {mode}: {MODE_TITLES.get(mode, 'not a mode of this version')}. "
                              f"Units per level {config.get('units')}, periods {config.get('periods')}, "
                              f"decoder weight beta {'the mode default' if beta is None else beta}. "
                              "Another mode's curve is in the report of a run with --set mode=...")]
    key, label = metrics[0]
    epochs, values = run_folder.epoch_curve((result.get("training") or {}).get("history") or {}, f"val_{key}")
    if epochs:
        flat = {f"{name} (test)": baseline[key] for name, baseline in (result.get("baseline") or {}).items()
                if isinstance(baseline.get(key), (int, float))}
        span = [epochs[0], epochs[-1]]
        series = {f"validation, mode {mode}": (epochs, values),
                  **{name: (span, [value, value]) for name, value in {**flat, **(levels or {})}.items()}}
        blocks.append(plots.line_chart(f"mode_{key}", f"{label} per epoch, mode {mode}", series, "epoch", label,
                                       markers=True))
    blocks.append(run_folder.last_epoch_table(result, metrics))
    return [Section(f"Task metric over training ({mode})", blocks, anchor="task-metric"), _bench_section(arrays)]


def _bench_section(arrays: Mapping[str, np.ndarray]) -> Section:
    """The memory per training step against the sequence length per mode, or how to get it."""
    if f"{BENCH_PREFIX}T" not in arrays:
        return Section("Memory bench", [Text(
            f"Not run: seqapps bench hrnn --out runs/{memory_bench.RESULT_IN_LOGDIR.as_posix()} (in the folder that "
            "holds saved_models) puts its curve in the reports of later runs, and in this one with seqapps report "
            "--refresh.")],
            anchor="memory-bench")
    bench = {field: arrays[f"{BENCH_PREFIX}{field}"] for field in memory_bench.ROW_FIELDS}
    order = np.argsort(bench["T"], kind="stable")
    bench = {field: values[order] for field, values in bench.items()}
    groups = np.array([f"k = {group}" if group != "sqrt" else "k = sqrt(2T)" for group in (
        memory_bench.period_group(int(length), int(period)) for length, period in zip(bench["T"], bench["k"]))])
    series = {f"{mode}, {group}": (bench["T"][groups == group], bench[f"{mode}_memory_mb"][groups == group])
              for mode in memory_bench.MODES for group in dict.fromkeys(groups)}
    figure = plots.line_chart("memory_bench", "training memory per step against sequence length", series,
                              "sequence length T", "peak memory of a step (MiB)", log_y=True, markers=True,
                              caption="seqapps bench hrnn: a 2-level GRU HRNN, each measurement in a fresh process")
    table = Table(["T", "k", "hrnn (MiB)", "decoupled (MiB)", "ratio", "theory T/(k+2T/k)", "hrnn step (s)",
                   "decoupled step (s)"],
                  [[int(bench["T"][i]), int(bench["k"][i]), *(float(bench[field][i]) for field in (
                      "hrnn_memory_mb", "decoupled_memory_mb", "memory_ratio", "theory_ratio", "hrnn_step_s",
                      "decoupled_step_s"))] for i in range(len(order))])
    settings = str(arrays.get(f"{BENCH_PREFIX}config", "{}"))
    return Section("Memory bench", [figure, table, Text(f"bench settings: {settings}")], anchor="memory-bench")
