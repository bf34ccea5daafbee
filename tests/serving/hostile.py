"""A real ``seqapps serve`` process for hostile requests: each one timed, its peak memory measured,
and a normal request sent after it.

Issue 25's acceptance, for every hostile request: a 4xx JSON error or the right answer in under
``MAX_SECONDS``, the server's peak RSS up by less than ``MAX_PEAK_RISE``, and a normal request
answered afterwards. ``check`` asserts all three.

The peak is Linux's high-water mark of the server process (``VmHWM``), reset before each request
by writing ``5`` to ``/proc/PID/clear_refs``; the rise is that peak minus the resident size just
before the request.
"""
from __future__ import annotations

import dataclasses
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx

REPO = Path(__file__).resolve().parents[2]

#: Issue 25: every hostile request is answered within this many seconds ...
MAX_SECONDS = 10.0
#: ... and raises the server's peak resident memory by less than this.
MAX_PEAK_RISE = 1 << 30


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one request got.

    Attributes:
        status: the HTTP status.
        body: the decoded JSON answer (``None`` when it is not JSON).
        seconds: from sending the request to the whole answer.
        peak_rise: bytes by which the server's peak RSS during the request exceeded its RSS before it.
    """

    status: int
    body: Any
    seconds: float
    peak_rise: int


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


class ServerProcess:
    """``python -m seqapps.cli serve MODEL_ROOT --port 0 [ARGS]`` in a subprocess, as a context manager.

    Args:
        model_root: the folder of ``<name>/<version>/`` exports.
        args: more ``seqapps serve`` arguments (for example ``["--grpc-port", "0"]``).
        start_timeout: seconds to wait for the server's ``seqapps serve: URL`` line.
    """

    def __init__(self, model_root: str | Path, args: list[str] | None = None, start_timeout: float = 300) -> None:
        self.model_root = Path(model_root)
        self.args = list(args or [])
        self.start_timeout = start_timeout
        self.process: subprocess.Popen | None = None
        self.base_url = ""
        self.grpc_port: int | None = None

    def __enter__(self) -> "ServerProcess":
        self.process = subprocess.Popen(
            [sys.executable, "-m", "seqapps.cli", "serve", str(self.model_root), "--port", "0", *self.args],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"})
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=self.start_timeout):
            self.__exit__()
            raise RuntimeError(f"seqapps serve printed nothing within {self.start_timeout} s")
        line = self.process.stdout.readline()
        if not line.startswith("seqapps serve: http://"):
            self.__exit__()
            raise RuntimeError(f"seqapps serve did not start: {line!r}")
        self.base_url = line.split()[2]
        if "(gRPC on " in line:
            self.grpc_port = int(line.rsplit(":", 1)[1].rstrip(")\n"))
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    @property
    def pid(self) -> int:
        """The server's process id."""
        assert self.process is not None, "the server is not running"
        return self.process.pid

    def rss(self) -> int:
        """The server's resident memory now, in bytes."""
        return _status_kib(self.pid, "VmRSS")

    def reset_peak(self) -> None:
        """Resets the server's peak-RSS mark to its RSS now."""
        with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")

    def peak(self) -> int:
        """The server's peak resident memory since the last ``reset_peak``, in bytes."""
        return _status_kib(self.pid, "VmHWM")

    def measure(self, send: Callable[[httpx.Client], httpx.Response], timeout: float = 120) -> Outcome:
        """Sends one request through ``send`` and measures it.

        Args:
            send: given a client on the server's base URL, sends the request and returns its response.
            timeout: the client's timeout, in seconds (above ``MAX_SECONDS``, so a slow answer is
                measured, not cut).

        Returns:
            The status, JSON body, seconds and peak-RSS rise.
        """
        with httpx.Client(base_url=self.base_url, timeout=timeout) as client:
            self.reset_peak()
            before = self.rss()
            began = time.monotonic()
            response = send(client)
            seconds = time.monotonic() - began
            peak_rise = self.peak() - before
        try:
            body = response.json()
        except ValueError:
            body = None
        return Outcome(response.status_code, body, seconds, peak_rise)

    def post(self, path: str, timeout: float = 120, **request: Any) -> Outcome:
        """POSTs to ``path`` (``json=`` or ``content=``, as httpx takes them) and measures it."""
        return self.measure(lambda client: client.post(path, **request), timeout)

    def check(self, outcome: Outcome, normal: Callable[[], Outcome], answered: Callable[[Any], bool] | None = None
              ) -> None:
        """Asserts issue 25's acceptance for one hostile request.

        Args:
            outcome: what the hostile request got.
            normal: sends a normal request (for example ``lambda: server.post(...)``); it must get 200.
            answered: for a request that may succeed: a check of its 200 body (the right answer).
                Without it, only a 4xx JSON error passes.
        """
        if outcome.status == 200 and answered is not None:
            assert answered(outcome.body), outcome.body
        else:
            assert 400 <= outcome.status < 500, outcome
            assert isinstance(outcome.body, dict) and isinstance(outcome.body.get("error"), str), outcome
        assert outcome.seconds < MAX_SECONDS, outcome
        assert outcome.peak_rise < MAX_PEAK_RISE, outcome
        assert self.process is not None and self.process.poll() is None, "the server died"
        after = normal()
        assert after.status == 200, after
