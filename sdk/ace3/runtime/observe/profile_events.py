"""torch.profiler results as files: what a job's profiler writes and the SDK reads back.

A profiled job leaves two files in its profiler directory:

- ``trace.json``: the Chrome trace of the recorded steps (``chrome://tracing``, Perfetto);
- ``key_averages.json``: ``{"format": FORMAT, "meta": {...}, "events": [...],
  "events_by_input_shape": [...] | null}``, where each event is one ``FunctionEventAvg``
  of ``prof.key_averages()`` (and of ``key_averages(group_by_input_shape=True)`` when shapes
  were recorded) as a dict of :data:`FIELDS` plus ``device_type`` (a ``DeviceType`` name) and
  ``top_level`` (False when the first call had a CPU parent).

:func:`rebuild_event_list` turns those dicts back into a real ``torch`` ``EventList`` of
``FunctionEventAvg``, so ``.table(sort_by=..., row_limit=...)`` prints torch's own table.
Reading and checking the file (:func:`read_key_averages`) needs no torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ace3.files import atomic_path

FORMAT = "ace3.key_averages/1"
TRACE_FILE = "trace.json"
KEY_AVERAGES_FILE = "key_averages.json"

# FunctionEventAvg attributes copied as they are (numbers, strings, flags, shapes, stacks).
FIELDS = (
    "key",
    "count",
    "node_id",
    "is_async",
    "is_remote",
    "use_device",
    "cpu_time_total",
    "device_time_total",
    "self_cpu_time_total",
    "self_device_time_total",
    "input_shapes",
    "overload_name",
    "stack",
    "scope",
    "cpu_memory_usage",
    "device_memory_usage",
    "self_cpu_memory_usage",
    "self_device_memory_usage",
    "is_legacy",
    "flops",
    "is_user_annotation",
)
_NUMBERS = (
    "count",
    "cpu_time_total",
    "device_time_total",
    "self_cpu_time_total",
    "self_device_time_total",
    "cpu_memory_usage",
    "device_memory_usage",
    "self_cpu_memory_usage",
    "self_device_memory_usage",
)


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)


def event_records(events: Any) -> list[dict[str, Any]]:
    """The JSON-ready dicts of an ``EventList`` of ``FunctionEventAvg``."""
    records = []
    for event in events:
        record = {name: _jsonable(getattr(event, name, None)) for name in FIELDS}
        device_type = getattr(event, "device_type", None)
        record["device_type"] = getattr(device_type, "name", "CPU")
        record["top_level"] = getattr(event, "cpu_parent", None) is None
        records.append(record)
    return records


def write_key_averages(prof: Any, directory: Path, meta: dict[str, Any]) -> Path:
    """Write ``key_averages.json`` for a stopped (or trace-ready) ``torch.profiler.profile``."""
    events = prof.key_averages()
    by_shape = None
    if meta.get("record_shapes"):
        by_shape = event_records(prof.key_averages(group_by_input_shape=True))
    full_meta = {
        **meta,
        "use_device": getattr(events, "_use_device", None),
        "profile_memory": bool(getattr(events, "_profile_memory", False)),
        "with_flops": bool(getattr(events, "_with_flops", False)),
    }
    return write_records(directory, full_meta, event_records(events), by_shape)


def write_records(
    directory: Path,
    meta: dict[str, Any],
    events: list[dict[str, Any]] | None,
    events_by_input_shape: list[dict[str, Any]] | None = None,
) -> Path:
    """Write ``key_averages.json`` atomically (``events`` None: nothing was recorded; ``meta``
    says why)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / KEY_AVERAGES_FILE
    body = {
        "format": FORMAT,
        "meta": meta,
        "events": events,
        "events_by_input_shape": events_by_input_shape,
    }
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(body, default=str), encoding="utf-8")
    return path


def _check_records(records: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(records, list):
        raise ValueError(f"{where}: expected a list of events, got {type(records).__name__}")
    for i, record in enumerate(records):
        if not isinstance(record, dict) or not isinstance(record.get("key"), str):
            raise ValueError(f"{where}[{i}]: expected an event with a string 'key'")
        for name in _NUMBERS:
            value = record.get(name, 0)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float))
            ):
                raise ValueError(f"{where}[{i}].{name}: expected a number, got {value!r}")
    return records


def read_key_averages(path: Path) -> dict[str, Any]:
    """Load and check a ``key_averages.json`` (no torch needed)."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} does not exist: the job wrote no profiler results (was the profiler "
            "spec in its config?)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{path} is not valid JSON ({exc}); the download may be truncated"
        ) from exc
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        found = body.get("format") if isinstance(body, dict) else type(body).__name__
        raise ValueError(f"{path}: expected format {FORMAT!r}, found {found!r}")
    if not isinstance(body.get("meta"), dict):
        raise ValueError(f"{path}: 'meta' must be an object")
    if body.get("events") is not None:
        _check_records(body["events"], f"{path}: events")
    if body.get("events_by_input_shape") is not None:
        _check_records(body["events_by_input_shape"], f"{path}: events_by_input_shape")
    return body


def rebuild_event_list(
    records: list[dict[str, Any]],
    *,
    use_device: str | None,
    profile_memory: bool,
    with_flops: bool,
) -> Any:
    """A torch ``EventList`` of ``FunctionEventAvg`` rebuilt from :func:`event_records`."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEventAvg

    parent = FunctionEventAvg()  # stands for "had a CPU parent" (top_level_events_only)
    parent.key = "<parent>"
    rebuilt = []
    for record in records:
        event = FunctionEventAvg()
        for name in FIELDS:
            if name in record and record[name] is not None:
                setattr(event, name, record[name])
        event.use_device = record.get("use_device") or use_device
        event.device_type = DeviceType.__members__.get(
            str(record.get("device_type", "CPU")), DeviceType.CPU
        )
        event.is_user_annotation = bool(record.get("is_user_annotation", False))
        event.cpu_parent = None if record.get("top_level", True) else parent
        event.cpu_children = []
        rebuilt.append(event)
    return EventList(
        rebuilt, use_device=use_device, profile_memory=profile_memory, with_flops=with_flops
    )
