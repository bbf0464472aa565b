"""``GET /metrics``: the reviewer's counters in the Prometheus text format (0.0.4).

Written here rather than through prometheus_client: a dozen series, one
process, no registry.  Counters and the scan-latency histogram are this
process's; the ``ckpt_guard_jobs`` gauge is read from the queue at scrape
time, so it is the same on every replica sharing a database.
"""

from __future__ import annotations

import bisect
import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SCAN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

# name -> (type, help, label name or None); the order is the order of the exposition.
SERIES = {
    "ckpt_guard_deliveries_received_total": ("counter", "Webhook deliveries received.", None),
    "ckpt_guard_deliveries_rejected_total": (
        "counter", "Deliveries refused: missing_secret, wrong_secret, too_large, bad_payload, queue_unavailable.",
        "reason"),
    "ckpt_guard_deliveries_ignored_total": ("counter", "Deliveries of events that are not reviewed.", None),
    "ckpt_guard_jobs_enqueued_total": ("counter", "Jobs accepted into the queue.", None),
    "ckpt_guard_jobs_duplicate_total": ("counter", "Jobs delivered again while queued, running or done.", None),
    "ckpt_guard_jobs_finished_total": (
        "counter", "Review attempts of this process: answered, skipped (already answered), quiet (no checkpoint file "
                   "changed), retried, failed, lost (lease taken over).",
        "outcome"),
    "ckpt_guard_pushes_quiet_total": (
        "counter", "Pushes reviewed without an answer: they changed no weight file, index or config.json.", None),
    "ckpt_guard_hub_requests_total": ("counter", "Hub requests of this process by answer (2xx, 429, error...).",
                                      "status"),
    "ckpt_guard_jobs": ("gauge", "Jobs in the queue by state (shared by every replica).", "state"),
    "ckpt_guard_queue_up": ("gauge", "1 if the queue's database answered this scrape.", None),
    "ckpt_guard_workers_alive": ("gauge", "Review worker threads alive in this process.", None),
    "ckpt_guard_scan_seconds": ("histogram", "Seconds from claiming a job to its answer on the Hub.", None),
}


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[str, float]] = {name: {} for name in SERIES}
        self._buckets = [0] * (len(SCAN_BUCKETS) + 1)
        self._sum = 0.0

    def inc(self, name: str, label: str = "", by: float = 1.0) -> None:
        if SERIES[name][0] != "counter":
            raise ValueError(name)
        with self._lock:
            values = self._values[name]
            values[label] = values.get(label, 0.0) + by

    def observe_scan(self, seconds: float) -> None:
        with self._lock:
            self._buckets[bisect.bisect_left(SCAN_BUCKETS, seconds)] += 1
            self._sum += seconds

    def value(self, name: str, label: str = "") -> float:
        with self._lock:
            return self._values[name].get(label, 0.0)

    def render(self, gauges: dict[str, dict[str, float]] | None = None) -> str:
        """The exposition; ``gauges`` are read by the caller at scrape time (name -> label -> value)."""
        gauges = gauges or {}
        lines: list[str] = []
        with self._lock:
            for name, (kind, text, label_name) in SERIES.items():
                lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
                if kind == "histogram":
                    lines += self._histogram(name)
                    continue
                values = gauges.get(name, {}) if kind == "gauge" else self._values[name]
                if label_name is None:
                    lines.append(f"{name} {_number(values.get('', 0.0))}")
                    continue
                for label in sorted(values):
                    lines.append(f'{name}{{{label_name}="{_escape(label)}"}} {_number(values[label])}')
        return "\n".join(lines) + "\n"

    def _histogram(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*SCAN_BUCKETS, float("inf")), self._buckets):
            running += count
            le = "+Inf" if bound == float("inf") else _number(bound)
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        return [*out, f"{name}_sum {_number(self._sum)}", f"{name}_count {running}"]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
