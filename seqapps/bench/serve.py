"""Benchmark of ``seqapps serve``: served REST throughput against in-process SavedModel calls.

Two ``seqapps serve`` subprocesses (without and with batching) run on free
loopback ports (their own interpreters, as in production) over one exported
pipeline; N client threads with keep-alive connections send the export's
warm-up request as row-format JSON. The same request is also called in-process
on the loaded SavedModel by N threads. The three modes are timed round-robin.
Clients and server share the machine's cores, so the served figures include the
clients' own HTTP work: ``http.client`` by default (about 0.2 ms of CPU per
request here), ``httpx`` on request (about 1.5 ms).

Two more phases run on the batching server: a mixed workload (half the clients
call the forecasting export, half ``--mixed-model``, text generation by default)
and a slow-client phase (the normal clients, while ``--slow-clients`` connections
trickle their headers a byte at a time until the header timeout closes them).
"""
from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import httpx
import numpy as np
import tensorflow as tf

from seqapps import export_format
from seqapps.errors import SeqappsError

TARGET_RATIO = 0.6
HEADER_TIMEOUT_S = 2.0  # the servers' header timeout: short, so the slow-client phase sees it close connections
HEADERS = {"content-type": "application/json"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the benchmark's options to ``parser``.

    Args:
        parser: the (sub)command parser.
    """
    parser.add_argument("--models", default=None,
                        help="model root to serve (default: a tiny weather_forecasting export in a temp folder)")
    parser.add_argument("--model", default=None, help="model name under --models (default: the first)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed seconds per mode (in-process, "
                        "served without batching, served with batching)")
    parser.add_argument("--rounds", type=int, default=5, help="round-robin segments the seconds are cut into")
    parser.add_argument("--client", choices=("http.client", "httpx"), default="http.client",
                        help="HTTP client of the client threads (httpx costs about 5x the client CPU)")
    parser.add_argument("--rows", type=int, default=1, help="instances per request")
    parser.add_argument("--max-batch-size", type=int, default=16, help="server batch size of the batching run")
    parser.add_argument("--batch-timeout-ms", type=float, default=0.0, help="server batch timeout of that run")
    parser.add_argument("--mixed-model", default="text_generation",
                        help="second model of the mixed phase, when its export is under --models (default: "
                             "text_generation; trained on its tiny preset in the default temp root)")
    parser.add_argument("--slow-clients", type=int, default=32,
                        help="connections that trickle headers one byte at a time during the slow-client phase")


def _example_inputs(version_dir: Path, rows: int) -> dict[str, np.ndarray]:
    """The first row of the export's warm-up request, repeated ``rows`` times."""
    relative = Path(export_format.ASSETS_EXTRA) / export_format.WARMUP_FILE
    if not (version_dir / relative).is_file():
        raise SeqappsError(f"{version_dir}: no {relative} to take a request from")
    request = export_format.read_warmup_requests(version_dir / relative)[0].predict_log.request
    inputs = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
    return {name: np.repeat(value[:1], rows, axis=0) for name, value in inputs.items()}


def _row_body(inputs: dict[str, np.ndarray]) -> bytes:
    """The row-format JSON of ``inputs``; bytes go as ``{"b64": ...}``."""
    def jsonable(value: Any) -> Any:
        value = np.asarray(value)  # a row of a 1-D input is a scalar
        if value.dtype.kind in "OS":
            return np.asarray(np.frompyfunc(lambda b: {"b64": base64.b64encode(b).decode()}, 1, 1)(value),
                              dtype=object).tolist()
        return value.tolist()

    rows = len(next(iter(inputs.values())))
    return json.dumps({"instances": [{name: jsonable(value[i]) for name, value in inputs.items()}
                                     for i in range(rows)]}).encode()


def _drive(calls: list[Callable[[], bool]], seconds: float) -> tuple[list[float], int, float]:
    """Runs each call in its own thread, back to back, for ``seconds``.

    Args:
        calls: one call per client thread; each answers whether its request succeeded.
        seconds: timed duration.

    Returns:
        The latencies in seconds, the number of failed calls, and the elapsed time.
    """
    latencies: list[list[float]] = [[] for _ in calls]
    errors = [0] * len(calls)
    barrier = threading.Barrier(len(calls) + 1)
    deadline = [0.0]

    def worker(index: int) -> None:
        barrier.wait()
        while (now := time.perf_counter()) < deadline[0]:
            ok = calls[index]()
            latencies[index].append(time.perf_counter() - now)
            errors[index] += not ok

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    barrier.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    return [t for per_thread in latencies for t in per_thread], sum(errors), time.perf_counter() - began


def _summary(latencies: list[float], errors: int, elapsed: float) -> dict[str, Any]:
    """Requests/s, p50/p99 latency (ms) and errors of the pooled timed segments of one mode."""
    times = np.asarray(latencies) * 1000
    return {"requests": int(times.size), "requests_per_s": round(times.size / elapsed, 1),
            "p50_ms": round(float(np.percentile(times, 50)), 2), "p99_ms": round(float(np.percentile(times, 99)), 2),
            "errors": errors}


def _http_client_call(url: str, path: str, body: bytes) -> Callable[[], bool]:
    """One keep-alive ``http.client`` connection posting ``body`` to ``url + path``."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)

    def call() -> bool:
        try:
            connection.request("POST", path, body, HEADERS)
            response = connection.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):
            connection.close()  # reconnects on the next request
            return False
        return response.status == 200
    return call


def _httpx_call(url: str, path: str, body: bytes) -> Callable[[], bool]:
    """One keep-alive ``httpx.Client`` posting ``body`` to ``url + path``."""
    client = httpx.Client(base_url=url, timeout=30)

    def call() -> bool:
        try:
            return client.post(path, content=body, headers=HEADERS).status_code == 200
        except httpx.HTTPError:
            return False
    return call


def _start_server(root: Path, max_batch_size: int, batch_timeout_ms: float,
                  log: Path) -> tuple[subprocess.Popen, str]:
    """Starts ``seqapps serve`` on a free loopback port; returns the process and its base URL."""
    with log.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "seqapps.cli", "serve", str(root), "--port", "0",
             "--max-batch-size", str(max_batch_size), "--batch-timeout-ms", str(batch_timeout_ms),
             "--header-timeout-s", str(HEADER_TIMEOUT_S)],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    line = process.stdout.readline()
    if not line.startswith("seqapps serve: http://"):
        process.kill()
        process.wait()
        raise SeqappsError(f"seqapps serve did not start: {log.read_text(errors='replace')[-500:]}")
    return process, line.split()[2]


def _mixed_phase(root: Path, name: str, args: argparse.Namespace, url: str, path: str, body: bytes,
                 make_call: Callable) -> dict[str, Any]:
    """Half the clients call ``name``, half ``--mixed-model`` (its warm-up request), on one server.

    Returns:
        Requests/s, p50/p99 and errors per model, or a note when the second export is absent.
    """
    other = args.mixed_model
    versions = export_format.version_dirs(root / other) if other else {}
    if not versions or other == name:
        return {"skipped": f"no {other} export under {root} besides {name}"}
    other_body = _row_body(_example_inputs(versions[max(versions)], 1))
    half = max(1, args.clients // 2)
    calls = [make_call(url, path, body) for _ in range(half)]
    calls += [make_call(url, f"/v1/models/{other}:predict", other_body) for _ in range(half)]
    kinds = [name] * half + [other] * half
    _drive(calls, 0.3)
    latencies, errors, elapsed = _drive_by_client(calls, args.seconds)
    return {model: _summary([t for kind, times in zip(kinds, latencies) if kind == model for t in times],
                            sum(e for kind, e in zip(kinds, errors) if kind == model), elapsed)
            for model in (name, other)}


def _drive_by_client(calls: list[Callable[[], bool]], seconds: float) -> tuple[list[list[float]], list[int], float]:
    """``_drive``, keeping each client's latencies and errors apart."""
    latencies: list[list[float]] = [[] for _ in calls]
    errors = [0] * len(calls)
    stop = time.perf_counter() + seconds

    def worker(index: int) -> None:
        while (now := time.perf_counter()) < stop:
            ok = calls[index]()
            latencies[index].append(time.perf_counter() - now)
            errors[index] += not ok

    began = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, errors, time.perf_counter() - began


def _slow_client_phase(args: argparse.Namespace, url: str, path: str, body: bytes,
                       make_call: Callable) -> dict[str, Any]:
    """The normal clients' figures while ``--slow-clients`` connections trickle their headers.

    Each slow connection sends one byte of a request line every 0.2 s and reconnects when the
    server closes it (its header timeout); the result counts those closes.
    """
    parts = urlsplit(url)
    stop = threading.Event()
    closed = [0]

    def trickle() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
                    for byte in b"POST /v1/models/x:predict HTTP/1.1\r\nHost: x\r\n" * 100:
                        if stop.wait(0.2):
                            return
                        sock.sendall(bytes([byte]))
            except OSError:
                closed[0] += 1

    slow = [threading.Thread(target=trickle, daemon=True) for _ in range(args.slow_clients)]
    for thread in slow:
        thread.start()
    try:
        calls = [make_call(url, path, body) for _ in range(args.clients)]
        _drive(calls, 0.3)
        figures = _summary(*_drive(calls, args.seconds))
    finally:
        stop.set()
        for thread in slow:
            thread.join()
    return {**figures, "slow_clients": args.slow_clients, "slow_connections_closed_by_server": closed[0]}


def _served_prediction(url: str, path: str, body: bytes) -> list[dict[str, Any]]:
    """The served ``predictions`` of one request (to compare with the in-process outputs)."""
    response = httpx.post(url + path, content=body, headers=HEADERS, timeout=30)
    response.raise_for_status()
    return response.json()["predictions"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Runs the benchmark.

    The in-process calls and the two servers (without and with batching) are
    driven round-robin in ``--rounds`` segments, so that their ratios hold even
    when other work on the machine comes and goes.

    Args:
        args: the parsed options (see ``add_arguments``).

    Returns:
        In-process and served (without and with batching) requests/s, p50/p99 latency in ms and
        errors, the served/in-process throughput ratios, and the largest served-vs-in-process output gap.
    """
    with tempfile.TemporaryDirectory(prefix="seqapps-bench-serve-") as tmp_name:
        tmp = Path(tmp_name)
        if args.models is None:
            from seqapps import runner

            root = tmp / "saved_models"
            runner.run("weather_forecasting", "tiny", out=root)
            if args.mixed_model:
                runner.run(args.mixed_model, "tiny", out=root)
        else:
            root = Path(args.models)
        names = sorted(p.name for p in root.iterdir() if export_format.version_dirs(p)) if root.is_dir() else []
        name = args.model or ("weather_forecasting" if "weather_forecasting" in names else
                              names[0] if names else None)
        if name not in names:
            raise SeqappsError(f"{root}: no exported model {name or ''} (expected NAME/VERSION/ folders)")
        versions = export_format.version_dirs(root / name)
        version_dir = versions[max(versions)]
        inputs = _example_inputs(version_dir, args.rows)
        body = _row_body(inputs)
        path = f"/v1/models/{name}:predict"

        signature = tf.saved_model.load(str(version_dir)).signatures[export_format.DEFAULT_SIGNATURE]

        def in_process() -> bool:
            signature(**{key: tf.constant(value) for key, value in inputs.items()})
            return True

        expected = {key: value.numpy() for key, value in signature(
            **{key: tf.constant(value) for key, value in inputs.items()}).items()}
        batch_sizes = {"no_batching": 0, "batching": args.max_batch_size}
        servers = {label: _start_server(root, size, args.batch_timeout_ms, tmp / f"{label}.log")
                   for label, size in batch_sizes.items()}
        try:
            make_call = _http_client_call if args.client == "http.client" else _httpx_call
            calls = {"in_process": [in_process] * args.clients}
            gaps = []
            for label, (_, url) in servers.items():
                predictions = _served_prediction(url, path, body)
                gaps += [float(np.max(np.abs(np.asarray([row[key] for row in predictions]) - value)))
                         for key, value in expected.items() if value.dtype.kind in "iuf"]
                calls[label] = [make_call(url, path, body) for _ in range(args.clients)]
            for mode_calls in calls.values():  # warm up: connections, first calls
                _drive(mode_calls, 0.3)
            pooled: dict[str, tuple[list[float], int, float]] = {mode: ([], 0, 0.0) for mode in calls}
            for _ in range(args.rounds):
                for mode, mode_calls in calls.items():
                    latencies, errors, elapsed = _drive(mode_calls, args.seconds / args.rounds)
                    before = pooled[mode]
                    pooled[mode] = (before[0] + latencies, before[1] + errors, before[2] + elapsed)
            _, batching_url = servers["batching"]
            phases = {"mixed": _mixed_phase(root, name, args, batching_url, path, body, make_call),
                      "slow_clients": _slow_client_phase(args, batching_url, path, body, make_call)}
        finally:
            for process, _ in servers.values():
                process.terminate()
                process.wait(timeout=30)
    figures = {mode: _summary(*values) for mode, values in pooled.items()}
    baseline = figures.pop("in_process")
    for label, size in batch_sizes.items():
        figures[label]["ratio_to_in_process"] = round(figures[label]["requests_per_s"] / baseline["requests_per_s"], 3)
        if size:
            figures[label].update(max_batch_size=size, batch_timeout_ms=args.batch_timeout_ms)
    return {"model": name, "version": int(version_dir.name), "clients": args.clients, "client": args.client,
            "seconds_per_mode": args.seconds, "rounds": args.rounds, "rows_per_request": args.rows,
            "request_bytes": len(body), "in_process": baseline, "served": figures,
            "max_abs_diff_served_vs_in_process": max(gaps), **phases,
            "target": f"0 errors and served >= {TARGET_RATIO} x in-process requests/s",
            "target_met": {label: f["errors"] == 0 and f["ratio_to_in_process"] >= TARGET_RATIO
                           for label, f in figures.items()}}
