"""Time from ``trainer.train()`` to the first metric on the client, and to the finished job.

Uses the service at ACE3_BASE_URL with ACE3_API_KEY when both are set; otherwise starts
``ace3 up`` (embedded SQLite + filesystem broker) in a temporary directory. Trains the digits
example with 2 processes, several times, and prints each phase per run and the median:

    .venv/bin/python benchmarks/time_to_first_metric.py [--runs 3] [--epochs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ace3

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples" / "digits"))
sys.path.insert(0, str(REPO))

from data import write_digits  # noqa: E402

from benchmarks.stack import service  # noqa: E402


def one_run(
    client: ace3.Client,
    model: ace3.ModelRef,
    train: ace3.DatasetRef,
    val: ace3.DatasetRef,
    epochs: int,
) -> dict[str, float]:
    config = ace3.TrainingConfig(num_gpus=2, batch_size=64, learning_rate=3e-3, log_interval=1)
    started = time.monotonic()
    handle = ace3.DistributedTrainer(config).train(
        model, train_dataset=train, validation_dataset=val, epochs=epochs, wait=False
    )
    submitted = time.monotonic()
    first_metric = None
    for event in handle.stream_events():
        if event.type == "metric" and first_metric is None:
            first_metric = time.monotonic()
        if event.type == "end":
            break
    ended = time.monotonic()
    job = handle.refresh()
    if job.state != "succeeded":
        raise SystemExit(f"job {job.id} ended {job.state}: {job.error}")
    first_stored = min(metric.created_at for metric in handle.metrics())
    return {
        "submit_s": submitted - started,
        "queue_s": (job.started_at - job.created_at).total_seconds(),
        "launch_to_metric_s": (first_stored - job.started_at).total_seconds(),
        "first_metric_s": (first_metric or ended) - started,
        "total_s": ended - started,
        "val_accuracy": float((job.final_metrics or {}).get("val_accuracy", float("nan"))),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    with (
        service() as (base_url, key),
        ace3.Client(api_key=key, base_url=base_url) as client,
        tempfile.TemporaryDirectory() as tmp,
    ):
        train_path, val_path = write_digits(Path(tmp))
        model = client.load_model(REPO / "examples" / "digits" / "model.py")
        train, val = client.load_dataset(train_path), client.load_dataset(val_path)
        rows = [one_run(client, model, train, val, args.epochs) for _ in range(args.runs)]
    print(f"digits MLP, 2 gloo processes, {args.epochs} epochs, service at {base_url}")
    columns = [
        ("submit_s", "train() returns"),
        ("queue_s", "queued->running"),
        ("launch_to_metric_s", "launch->1st metric stored"),
        ("first_metric_s", "train()->1st metric on client"),
        ("total_s", "train()->job end"),
        ("val_accuracy", "val acc"),
    ]
    print("seconds; 'queued->running' and 'launch->1st metric stored' use the server's timestamps")
    print("run  " + "  ".join(title for _, title in columns))
    median = {key: statistics.median(row[key] for row in rows) for key, _ in columns}
    for label, row in [*((str(i), r) for i, r in enumerate(rows, 1)), ("med", median)]:
        print(f"{label:<5}" + "  ".join(f"{row[key]:>{len(title)}.2f}" for key, title in columns))
    return 0


if __name__ == "__main__":
    sys.exit(main())
