"""Request counts and latencies per model in Prometheus' text format, under TF Serving's metric names.

TF Serving exposes ``:tensorflow:serving:request_count{model_name, status}`` and the histogram
``:tensorflow:serving:request_latency{model_name, API, entrypoint}`` (microseconds) at
``/monitoring/prometheus/metrics``; the same names and labels are kept here, so that existing
dashboards work. The format is written directly: ``prometheus_client`` would rename the counter
to ``..._total``.
"""
from __future__ import annotations

import bisect
import collections
import threading

COUNT = ":tensorflow:serving:request_count"
LATENCY = ":tensorflow:serving:request_latency"
# Microsecond bucket bounds: 10 us to about 100 s, 1.5x apart (TF Serving's buckets grow geometrically too).
BUCKETS = tuple(round(10 * 1.5 ** i) for i in range(40) if 10 * 1.5 ** i < 1.2e8)


def _labels(**labels: str) -> str:
    escaped = (f'{key}="{value}"'.replace("\n", " ") for key, value in labels.items())
    return "{" + ",".join(escaped) + "}"


class Metrics:
    """Thread-safe counters and latency histograms of the requests served."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: collections.Counter = collections.Counter()
        self._buckets: dict[tuple[str, str, str], list[int]] = {}
        self._sums: collections.Counter = collections.Counter()

    def record(self, model: str, api: str, entrypoint: str, status: str, seconds: float) -> None:
        """Counts one request.

        Args:
            model: the model name asked for.
            api: ``predict``, ``classify``, ``regress``, ``GetModelMetadata``, ...
            entrypoint: ``REST`` or ``GRPC``.
            status: ``OK`` or the gRPC-style error code name (``INVALID_ARGUMENT``, ...).
            seconds: the request's latency.
        """
        micros = seconds * 1e6
        key = (model, api, entrypoint)
        with self._lock:
            self._counts[(model, status)] += 1
            buckets = self._buckets.setdefault(key, [0] * (len(BUCKETS) + 1))
            buckets[bisect.bisect_left(BUCKETS, micros)] += 1
            self._sums[key] += micros

    def render(self) -> str:
        """The metrics in Prometheus' text exposition format."""
        with self._lock:
            lines = [f"# TYPE {COUNT} counter"]
            lines += [f"{COUNT}{_labels(model_name=model, status=status)} {count}"
                      for (model, status), count in sorted(self._counts.items())]
            lines.append(f"# TYPE {LATENCY} histogram")
            for (model, api, entrypoint), buckets in sorted(self._buckets.items()):
                labels = {"model_name": model, "API": api, "entrypoint": entrypoint}
                total = 0
                for bound, count in zip((*BUCKETS, "+Inf"), buckets):
                    total += count
                    lines.append(f"{LATENCY}_bucket{_labels(**labels, le=str(bound))} {total}")
                lines.append(f"{LATENCY}_sum{_labels(**labels)} {self._sums[(model, api, entrypoint)]:.1f}")
                lines.append(f"{LATENCY}_count{_labels(**labels)} {total}")
        return "\n".join(lines) + "\n"


STATUS_NAMES = {200: "OK", 400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 405: "UNIMPLEMENTED",
                412: "FAILED_PRECONDITION", 499: "CANCELLED", 500: "INTERNAL", 503: "UNAVAILABLE",
                504: "DEADLINE_EXCEEDED"}
