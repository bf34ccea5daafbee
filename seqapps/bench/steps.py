"""The harness of the training-step benchmarks: memory and time of a few steps, each case in a fresh process.

``measure_steps`` traces a step function, then runs it; the memory is the peak
resident set size during the steps minus the RSS just before the first one (the
peak is reset there through ``/proc/self/clear_refs``, so tracing's own peak does
not count). On a GPU it is the allocator's peak minus its use at the same point.
``run_worker`` runs one case as ``python -m MODULE --worker ...`` and reads the
JSON line it prints, so that one case's allocations never inflate another's.
"""
from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, Callable


def _rss_mb() -> float:
    """The process's current resident set size, in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("VmRSS not found in /proc/self/status")


def _reset_peak_rss() -> None:
    """Resets the kernel's peak RSS to the current RSS (Linux >= 4.0); without it the peak is the lifetime one."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
    except OSError:
        pass


def _peak_rss_mb() -> float:
    """The process's peak resident set size since the last reset, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def measure_steps(train_step: Any, args: tuple, warm_up: Callable[[], Any], steps: int) -> dict[str, Any]:
    """Traces ``train_step(*args)``, calls ``warm_up()``, then times ``steps`` calls and measures their memory.

    Args:
        train_step: a ``tf.function`` returning the step's scalar loss.
        args: its arguments, the same at every step.
        warm_up: run after tracing and before the baseline (for example one forward
            call), so that lazily built state is not counted as the steps' memory.
        steps: training steps to run.

    Returns:
        ``{"memory_mb", "step_s" (median of the steps after the first), "first_step_s",
        "trace_s", "device"}``.

    Raises:
        FloatingPointError: if the last loss is not finite.
    """
    import tensorflow as tf

    gpu = bool(tf.config.list_physical_devices("GPU"))
    start = time.perf_counter()
    train_step.get_concrete_function(*args)
    warm_up()
    trace_s = time.perf_counter() - start
    if gpu:
        tf.config.experimental.reset_memory_stats("GPU:0")
        baseline = tf.config.experimental.get_memory_info("GPU:0")["current"] / 2**20
    else:
        baseline = _rss_mb()
        _reset_peak_rss()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = float(train_step(*args))
        times.append(time.perf_counter() - start)
    peak = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20 if gpu else _peak_rss_mb()
    if not math.isfinite(loss):
        raise FloatingPointError(f"non-finite loss {loss}")
    return {
        "memory_mb": round(peak - baseline, 1),
        "step_s": round(statistics.median(times[1:] or times), 3),
        "first_step_s": round(times[0], 3),
        "trace_s": round(trace_s, 3),
        "device": "GPU" if gpu else "CPU",
    }


def run_worker(module: str, options: dict[str, Any]) -> dict[str, Any]:
    """Runs ``python -m module --worker --name value ...`` in a fresh process and returns its last JSON line.

    Args:
        module: the benchmark module (its ``main`` handles ``--worker``).
        options: option names (underscores become dashes) and values.

    Returns:
        The worker's result.

    Raises:
        RuntimeError: with the worker's stderr, if it fails.
    """
    command = [sys.executable, "-m", module, "--worker"]
    for name, value in options.items():
        command += [f"--{name.replace('_', '-')}", str(value)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"worker {' '.join(command[3:])} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
