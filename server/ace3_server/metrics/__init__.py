"""Prometheus metrics of the API: ``GET /metrics`` (:mod:`.endpoint`).

Two kinds of values: per-process ones this API process measures itself (request latency by
route template, open event streams: :mod:`.http`), and cluster-wide ones read from the
database at scrape time (jobs by state, queue wait, time to first metric, workers, ingested
points: :mod:`.database`), which every API process reports alike.
"""
