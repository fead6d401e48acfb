"""Prometheus metric families built from a :class:`DatabaseSnapshot` (one scrape's values)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ace3_server.metrics.database import DatabaseSnapshot, HistogramCounts


def _histogram(name: str, documentation: str, counts: HistogramCounts) -> HistogramMetricFamily:
    buckets = [
        (_bound(bound), float(value))
        for bound, value in zip(counts.bounds, counts.cumulative, strict=True)
    ]
    buckets.append(("+Inf", float(counts.count)))
    return HistogramMetricFamily(name, documentation, buckets=buckets, sum_value=counts.total)


def _bound(bound: float) -> str:
    return f"{bound:g}" if bound != int(bound) else f"{bound:.1f}"


class DatabaseCollector(Collector):
    """The cluster-wide metrics of one scrape; ``snapshot`` None means the database could not
    be read (only ``ace3_database_up 0`` is reported then)."""

    def __init__(self, snapshot: DatabaseSnapshot | None) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "ace3_database_up",
            "Whether this scrape could read the cluster-wide metrics from the database.",
            value=0 if self.snapshot is None else 1,
        )
        yield up
        snap = self.snapshot
        if snap is None:
            return
        jobs = GaugeMetricFamily("ace3_jobs", "Jobs in each state (all owners).", labels=["state"])
        for state, count in sorted(snap.jobs_by_state.items()):
            jobs.add_metric([state], count)
        yield jobs
        if snap.queue_wait is not None:
            yield _histogram(
                "ace3_job_queue_wait_seconds",
                "From a job's (last) entry into queued to its attempt running, over the jobs "
                "that started.",
                snap.queue_wait,
            )
        if snap.first_metric is not None:
            yield _histogram(
                "ace3_job_time_to_first_metric_seconds",
                "From a job's attempt running to its first metric point stored, over the jobs "
                "that reported one.",
                snap.first_metric,
            )
        yield CounterMetricFamily(
            "ace3_metric_points_ingested",
            "Metric points the workers stored (the newest job_metrics id).",
            value=snap.metric_points,
        )
        yield CounterMetricFamily(
            "ace3_log_lines_ingested",
            "Training log lines the workers stored (the newest job_logs id).",
            value=snap.log_lines,
        )
        yield GaugeMetricFamily(
            "ace3_workers_live", "Workers of this API's queue seen recently.", snap.live_workers
        )
        yield GaugeMetricFamily(
            "ace3_worker_slots", "Job slots of the live workers, summed.", snap.worker_slots
        )
        yield GaugeMetricFamily(
            "ace3_worker_slots_free",
            "Slots of the live workers not held by an active job or a node of a multi-node job.",
            snap.free_slots,
        )
        yield GaugeMetricFamily(
            "ace3_worker_devices",
            "Processes one job may run on each live worker (GPUs or CPU processes), summed.",
            snap.worker_devices,
        )
