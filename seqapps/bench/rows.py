"""Benchmark of a forecasting run against the length of the user's CSV: rows per second and peak memory.

For each row count it writes a CSV of a 15-minute series (a daily and weekly pattern
plus seeded noise), then runs ``seqapps run PIPELINE --preset PRESET --data CSV [--set k=v]...``
(``tiny`` by default) in a fresh process and reads that process's peak resident set size from the kernel
(``wait4``). Rows per second is the row count over the wall time of the whole run:
reading and validating the CSV, cutting windows, a few training steps, evaluating on
the test split and exporting.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the benchmark's options to ``parser``."""
    parser.add_argument("--rows", default="100000,500000,2000000", help="comma-separated row counts")
    parser.add_argument("--pipeline", default="load_forecasting", help="a forecasting pipeline")
    parser.add_argument("--freq", default="15min", help="sampling interval of the generated series")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated noise")
    parser.add_argument("--preset", default="tiny", help="the run's preset (default: tiny)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of the run, as seqapps run takes it (repeatable; for example "
                             "--preset default --set epochs=1 --set steps_per_epoch=4 bounds the default's training)")


def write_series_csv(path: Path, rows: int, freq: str, seed: int) -> None:
    """Writes ``timestamp,demand`` rows of a seasonal series with noise."""
    import pandas as pd

    times = pd.date_range("2000-01-01", periods=rows, freq=freq)
    hours = (times.hour + times.minute / 60).to_numpy()
    demand = (30_000 + 5_000 * np.sin(2 * np.pi * hours / 24) + 2_000 * (times.weekday < 5)
              + np.random.default_rng(seed).normal(0, 500, rows))
    pd.DataFrame({"timestamp": times.strftime("%Y-%m-%d %H:%M"), "demand": demand.round(1)}).to_csv(path, index=False)


def measure(pipeline: str, csv: Path, out: Path, preset: str = "tiny", overrides: list[str] | None = None
            ) -> dict[str, Any]:
    """Runs ``pipeline`` on ``csv`` in a fresh process.

    Args:
        pipeline: a forecasting pipeline's name.
        csv: the series.
        out: the export root of the run.
        preset: the run's preset.
        overrides: ``key=value`` config overrides.

    Returns:
        The run's seconds and its peak RSS in MiB.
    """
    sets = [arg for item in overrides or [] for arg in ("--set", item)]
    command = [sys.executable, "-m", "seqapps.cli", "run", pipeline, "--preset", preset, "--data", str(csv),
               "--out", str(out), "--json", *sets]
    start = time.perf_counter()
    with open(out.parent / "run.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {(out.parent / 'run.log').read_text()[-2000:]}")
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}  # Linux: KiB


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measures each row count; returns the figures per row count."""
    results = []
    for rows in (int(r) for r in args.rows.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            csv = Path(folder) / "series.csv"
            write_series_csv(csv, rows, args.freq, args.seed)
            figures = measure(args.pipeline, csv, Path(folder) / "out", args.preset, args.overrides)
            results.append({"rows": rows, "csv_mb": round(csv.stat().st_size / 2**20, 1), **figures,
                            "rows_per_second": round(rows / figures["seconds"])})
            print(results[-1], file=sys.stderr, flush=True)
    return {"pipeline": args.pipeline, "preset": args.preset, "overrides": args.overrides, "freq": args.freq,
            "results": results}
