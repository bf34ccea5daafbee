"""Benchmark of training memory and step time: full-gradient HRNN vs decoupled HRNN.

A 2-level ``DecoupledHRNN`` (GRU cells) with a linear head and a per-step MSE
loss trains a few SGD steps on random data, in ``hrnn`` mode (plain autodiff)
and in ``decoupled`` mode (``loss_and_gradients``: segment recomputation), for
each sequence length T with k = 10 and k = round(sqrt(2T)). Each measurement
runs in a fresh process (``python -m seqapps.bench.hrnn --worker ...``).

Memory on CPU is the process's peak RSS after the training steps minus its RSS
just before the first step, taken after tracing the step and one forward call;
on a GPU it is the allocator's peak minus its use at the same point. The
theoretical ratio for the lower/upper state counts is T / (k + 2T/k).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

MODES = ("hrnn", "decoupled")
FEATURES = 64


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


def _rss_mb() -> float:
    """The process's current resident set size, in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmRSS not found in /proc/self/status")


def _peak_rss_mb() -> float:
    """The process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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
    gpu = bool(tf.config.list_physical_devices("GPU"))
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
    start = time.perf_counter()
    train_step.get_concrete_function(x, y)
    forward(x).numpy()
    trace_s = time.perf_counter() - start
    if gpu:
        tf.config.experimental.reset_memory_stats("GPU:0")
        baseline = tf.config.experimental.get_memory_info("GPU:0")["current"] / 2**20
    else:
        baseline = _rss_mb()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = float(train_step(x, y))
        times.append(time.perf_counter() - start)
    if gpu:
        peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    else:
        peak = _peak_rss_mb()
    if not math.isfinite(loss):
        raise FloatingPointError(f"non-finite loss {loss} in mode {mode}")
    return {
        "memory_mb": round(peak - baseline, 1),
        "step_s": round(statistics.median(times[1:] or times), 3),
        "first_step_s": round(times[0], 3),
        "trace_s": round(trace_s, 3),
        "device": "GPU" if gpu else "CPU",
    }


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
    command = [
        sys.executable, "-m", "seqapps.bench.hrnn", "--worker",
        "--mode", mode, "--seq-length", str(length), "--period", str(period),
        "--units", str(args.units), "--batch", str(args.batch), "--steps", str(args.steps), "--seed", str(args.seed),
    ]  # fmt: skip
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"worker {mode} T={length} k={period} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


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
    return {"config": config, "results": rows, "targets": targets}


def _by_period(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows grouped by k = 10 versus k = sqrt(2T), each sorted by T."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in sorted(rows, key=lambda r: r["T"]):
        key = "sqrt" if row["k"] == round(math.sqrt(2 * row["T"])) else str(row["k"])
        groups.setdefault(key, []).append(row)
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
