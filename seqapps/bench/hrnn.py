"""Benchmark of training memory and step time: full-gradient HRNN vs decoupled HRNN.

A 2-level ``DecoupledHRNN`` (GRU cells) with a linear head and a per-step MSE
loss trains a few SGD steps on random data, in ``hrnn`` mode (plain autodiff)
and in ``decoupled`` mode (``loss_and_gradients``: segment recomputation), for
each sequence length T with k = 10 and k = round(sqrt(2T)). Each measurement
runs in a fresh process (``python -m seqapps.bench.hrnn --worker ...``).

Memory (``seqapps.bench.steps``) is the peak RSS during the training steps minus
the RSS just before the first step, taken after tracing the step and one forward
call; on a GPU it is the allocator's peak minus its use at the same point. The
theoretical ratio for the lower/upper state counts is T / (k + 2T/k).

``--out FILE`` also writes the result as JSON. Written to ``runs/bench/hrnn.json``, in the
``--logdir`` beside ``saved_models`` (``RESULT_IN_LOGDIR``), it is read by the report of every
HRNN pipeline run after it (copy_task, pixel_mnist, hrnn_char_lm: ``seqapps.hrnn``), which draws
the memory per training step against T for each mode.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

from seqapps.bench import steps as steps_harness
from seqapps.errors import DataError

MODES = ("hrnn", "decoupled")
FEATURES = 64
#: where the HRNN pipelines' reports look for ``--out``'s file, relative to the runs folder (``--logdir``)
RESULT_IN_LOGDIR = Path("bench") / "hrnn.json"
#: the fields of a result row that the reports read
ROW_FIELDS = ("T", "k", "hrnn_memory_mb", "decoupled_memory_mb", "hrnn_step_s", "decoupled_step_s",
              "memory_ratio", "theory_ratio")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the benchmark's options to ``parser``.

    Args:
        parser: the (sub)command parser.
    """
    parser.add_argument("--seq-lengths", default="200,1000,4000", help="comma-separated sequence lengths T")
    parser.add_argument("--units", type=int, default=256, help="GRU units of both levels")
    parser.add_argument("--batch", type=int, default=32, help="batch size")
    parser.add_argument("--steps", type=int, default=3, help="training steps per measurement")
    parser.add_argument("--periods", default="10,sqrt", help="comma-separated k values; 'sqrt' is round(sqrt(2T))")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and data")
    parser.add_argument("--out", default=None, metavar="FILE",
                        help=f"also write the JSON result to FILE; runs/{RESULT_IN_LOGDIR} (beside saved_models) "
                             "puts its curve in the reports of the HRNN pipelines' later runs")


def measure(mode: str, length: int, period: int, units: int, batch: int, steps: int, seed: int) -> dict[str, Any]:
    """Trains ``steps`` steps in this process and returns its memory and times.

    Args:
        mode: ``"hrnn"`` or ``"decoupled"``.
        length: sequence length T.
        period: k.
        units: GRU units.
        batch: batch size.
        steps: training steps.
        seed: seed of the weights and data.

    Returns:
        ``{"memory_mb", "step_s", "first_step_s", "trace_s", "device"}``.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from seqapps.layers.hierarchical_rnn import DecoupledHRNN

    keras.utils.set_random_seed(seed)
    layer = DecoupledHRNN(
        [keras.layers.GRUCell(units), keras.layers.GRUCell(units)],
        periods=period,
        mode=mode,
        output_units=FEATURES,
        aux_hidden_units=units,
    )
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, length, FEATURES)).astype("float32"))
    y = tf.constant(rng.normal(size=(batch, length, FEATURES)).astype("float32"))
    layer.build(tuple(x.shape))
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(layer.trainable_variables)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        loss, grads = layer.loss_and_gradients(x, y, "mse")
        optimizer.apply(grads, layer.trainable_variables)
        return loss

    forward = tf.function(lambda x: layer(x))
    return steps_harness.measure_steps(train_step, (x, y), lambda: forward(x).numpy(), steps)


def _periods(spec: str, length: int) -> list[int]:
    """The k values of ``--periods`` for sequence length ``length``, without duplicates."""
    values = []
    for item in spec.split(","):
        value = round(math.sqrt(2 * length)) if item.strip() == "sqrt" else int(item)
        if value not in values:
            values.append(value)
    return values


def _run_worker(mode: str, length: int, period: int, args: argparse.Namespace) -> dict[str, Any]:
    """Runs one measurement in a fresh Python process and returns its result."""
    return steps_harness.run_worker("seqapps.bench.hrnn", {
        "mode": mode, "seq_length": length, "period": period, "units": args.units, "batch": args.batch,
        "steps": args.steps, "seed": args.seed})


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs every measurement and returns the JSON-able report.

    Args:
        args: the parsed options of ``add_arguments``.

    Returns:
        ``{"config", "results": [one row per (T, k)], "targets"}``. Each row has
        per-mode memory (MiB) and step time (s), the measured memory ratio
        hrnn / decoupled, the theoretical ratio T / (k + 2T/k), and the step
        time ratio decoupled / hrnn.
    """
    lengths = [int(t) for t in args.seq_lengths.split(",")]
    rows = []
    for length in lengths:
        for period in _periods(args.periods, length):
            row: dict[str, Any] = {"T": length, "k": period}
            for mode in MODES:
                result = _run_worker(mode, length, period, args)
                row[f"{mode}_memory_mb"] = result["memory_mb"]
                row[f"{mode}_step_s"] = result["step_s"]
                row["device"] = result["device"]
            row["memory_ratio"] = round(row["hrnn_memory_mb"] / max(row["decoupled_memory_mb"], 1e-3), 2)
            row["theory_ratio"] = round(length / (period + 2 * length / period), 2)
            row["time_ratio"] = round(row["decoupled_step_s"] / row["hrnn_step_s"], 2)
            rows.append(row)
    longest = max(lengths)
    at_longest = [row for row in rows if row["T"] == longest]
    targets = {
        "memory_ratio_k10_at_max_T>=3.5": any(r["k"] == 10 and r["memory_ratio"] >= 3.5 for r in at_longest),
        "memory_ratio_ksqrt_at_max_T>=8": any(
            r["k"] == round(math.sqrt(2 * longest)) and r["memory_ratio"] >= 8 for r in at_longest
        ),
        "ratio_grows_with_T": all(
            a["memory_ratio"] <= b["memory_ratio"]
            for period_rows in _by_period(rows).values()
            for a, b in zip(period_rows, period_rows[1:])
        ),
        "time_ratio<=1.5": all(r["time_ratio"] <= 1.5 for r in rows),
    }
    config = {
        "units": args.units, "batch": args.batch, "steps": args.steps, "features": FEATURES,
        "cells": "GRU", "levels": 2, "seq_lengths": lengths, "periods": args.periods,
    }  # fmt: skip
    report = {"config": config, "results": rows, "targets": targets}
    if getattr(args, "out", None):
        write_result(Path(args.out), report)
    return report


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Writes a result as JSON, whole (a temporary file renamed), making its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.partial")
    partial.write_text(json.dumps(result, indent=2), encoding="utf-8")
    os.replace(partial, path)


def read_result(path: Path) -> dict[str, Any] | None:
    """The result ``--out`` wrote, or None where there is no such file.

    Raises:
        DataError: the file is not a result of this benchmark (it names the file and what is missing).
    """
    if not path.is_file():
        return None
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        rows = result["results"]
        missing = [field for field in ROW_FIELDS for row in rows if not isinstance(row.get(field), (int, float))]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise DataError(f"{path}: expected the JSON of seqapps bench hrnn --out ({type(error).__name__}: {error})") \
            from None
    if missing or not rows:
        raise DataError(f"{path}: expected result rows with numbers {', '.join(ROW_FIELDS)}; "
                        + (f"{missing[0]!r} is missing" if missing else "it has none"))
    return result


def period_group(length: int, period: int) -> str:
    """The group of a row's k: ``"sqrt"`` for k = round(sqrt(2T)), else k itself (one curve per group)."""
    return "sqrt" if period == round(math.sqrt(2 * length)) else str(period)


def _by_period(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by k = 10 versus k = sqrt(2T), each sorted by T."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["T"]):
        groups.setdefault(period_group(row["T"], row["k"]), []).append(row)
    return groups


def main(argv: list[str] | None = None) -> None:
    """Entry point of ``python -m seqapps.bench.hrnn``: a worker, or the whole benchmark."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--worker", action="store_true", help="run one measurement and print it as JSON")
    parser.add_argument("--mode", choices=MODES, default="decoupled", help="worker: training mode")
    parser.add_argument("--seq-length", type=int, default=1000, help="worker: sequence length T")
    parser.add_argument("--period", type=int, default=10, help="worker: k")
    args = parser.parse_args(argv)
    if args.worker:
        result = measure(args.mode, args.seq_length, args.period, args.units, args.batch, args.steps, args.seed)
    else:
        result = run(args)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
