"""Streamed datasets from a bucket, side by side in one run on a real S3 server (SeaweedFS's
``weed mini``, as the tests start it: ``tests/object_store.py``):

(a) shard fetch throughput: the worker's fetch path (``ace3_worker.shard_fetch.obtain`` into a
    ``ShardCache``: If-Match GETs, sha256 while written, rename; no fsync where the cache is
    tagged with this boot, ``ace3_worker.shard_cache_boot``) against a plain boto3
    ``download_file`` of the same objects, alternating: 10 MiB shards one at a time and 4 at a
    time (the feeder's concurrency), 128 MiB objects one at a time (goal: ratio >= 0.8);
(b) time to the first step of a 2-rank job on a 2 GB tokens dataset against a 20 MB one (the
    same 10 MiB shards; the job's ``started_at`` to its first stored metric, every run with a
    cold node cache, alternating; goal: medians at most 2 s apart);
(c) the share of a step the ranks wait for data (``data_wait_ms_rank<r>`` against
    ``step_time_ms_rank<r>`` in the training metrics, steps after the first) with a model whose
    step takes about 20 ms (it sleeps: the CPUs stay free for the ranks' reading and the
    worker's fetching), streaming the 2 GB dataset (goal: at most 5%);
(d) the peak disk use of the node cache (unique inodes under the cache and the jobs' work
    directory, sampled every 20 ms) while every job above runs and one more reads shards as fast
    as it can, with ``ACE3_DATASET_CACHE_BYTES`` well under the dataset (goal: at most the bound
    plus two shards).

(b) to (d) run through the real API and worker (``ace3 up``: ``benchmarks/stack.py``), allowed
the bucket by ``ACE3_DATASET_SOURCES`` and reading it with ``ACE3_S3_ENDPOINT_URL`` and
``AWS_*``. The data is random uint16 tokens, generated and uploaded once; everything lives in a
temporary directory that is removed at the end (about 2.5 GB at the peak)::

    .venv/bin/python benchmarks/data_streaming.py [--repeats 3] [--large-shards 200]

It always starts a service of its own (``ACE3_BASE_URL`` / ``ACE3_API_KEY`` are ignored).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import ace3  # noqa: E402
from benchmarks.job_latency import wait_until_quiet, wall  # noqa: E402
from benchmarks.stack import service  # noqa: E402
from tests.object_store import ObjectStore, seaweedfs  # noqa: E402

MiB = 1 << 20
BUCKET = "ace3-bench-streams"
PROBE_MODEL = """
import time
from types import SimpleNamespace

import torch
from torch import nn


class Probe(nn.Module):
    \"\"\"A step of ``delay`` seconds (asleep) on token batches; the loss reads the tokens.\"\"\"

    def __init__(self, delay):
        super().__init__()
        self.head = nn.Linear(8, 1)
        self.delay = delay

    def forward(self, input_ids, labels):
        if self.training and self.delay:
            time.sleep(self.delay)
        features = (input_ids[:, :8] + labels[:, :8]).float() / 131070.0
        return SimpleNamespace(loss=self.head(features).pow(2).mean())


def build_model(delay=0.0):
    torch.manual_seed(0)
    return Probe(delay)
"""


def upload(s3: Any, prefix: str, count: int, size: int) -> None:
    """``count`` objects of ``size`` random bytes (uint16 tokens) under ``prefix``."""

    def one(index: int) -> None:
        rng = np.random.default_rng(index)
        tokens = rng.integers(0, 65535, size // 2, dtype=np.uint16)
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}{index:05d}.bin", Body=tokens.tobytes())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(count)))


# -- (a) fetch throughput ---------------------------------------------------------------------
def fetch_throughput(
    store: ObjectStore, prefix: str, root: Path, repeats: int, at_once: int = 1
) -> dict[str, Any]:
    """MiB/s of the worker's fetch path and of boto3's download_file over the objects under
    ``prefix``, ``at_once`` objects at a time (the feeder fetches up to 4); each repeat runs
    both, alternating which goes first."""
    import boto3

    from ace3_control.dataset_sources import list_manifest
    from ace3_control.settings import Settings
    from ace3_control.source_client import source_client
    from ace3_worker.shard_cache import ShardCache
    from ace3_worker.shard_fetch import S3ShardSource, obtain

    client = source_client(Settings(data_dir=root, s3_endpoint_url=store.endpoint_url))
    manifest = list_manifest(client, f"s3://{BUCKET}/{prefix}", "tokens")
    plain_client = boto3.client("s3", endpoint_url=store.endpoint_url, region_name="us-east-1")
    total = sum(shard.size for shard in manifest.shards) / MiB
    numbered = list(enumerate(manifest.shards))

    cpu: dict[str, list[float]] = {"worker": [], "plain": [], "verified": []}

    def timed(one: Any, name: str) -> float:
        """MiB/s; the CPU seconds per GiB this process spent (every thread) go to cpu[name]."""
        started, used = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(at_once) as pool:
            list(pool.map(one, numbered))
        cpu[name].append((time.process_time() - used) / total * 1024)
        return total / (time.perf_counter() - started)

    def worker() -> float:
        cache = ShardCache(root / "fetch-cache", 1 << 40)
        source, stop = S3ShardSource(manifest.uri, client), threading.Event()
        rate = timed(lambda item: obtain(
            cache, source, manifest.digest(), f"{item[0]:06d}.bin", item[1], stop=stop, wait=True
        ), "worker")  # fmt: skip
        shutil.rmtree(root / "fetch-cache")
        return rate

    def download(verify: bool) -> Callable[[], float]:
        """boto3's download_file; ``verify``: then their sha256 (read back) and an fsync, what a
        user who wanted the bytes checked and durable would do (the cache hashes them and,
        trusting them only in this boot, does not fsync them)."""

        def one(item: tuple[int, Any]) -> None:
            path = target / item[1].name
            plain_client.download_file(BUCKET, f"{prefix}{item[1].name}", str(path))
            if verify:
                with path.open("rb") as copy:
                    hashlib.file_digest(copy, "sha256")
                    os.fsync(copy.fileno())

        def run() -> float:
            target.mkdir()
            rate = timed(one, "verified" if verify else "plain")
            shutil.rmtree(target)
            return rate

        target = root / "fetch-plain"
        return run

    runs = {"worker": worker, "plain": download(False), "verified": download(True)}
    for run in runs.values():
        run()  # (a round unmeasured: connections, threads, the server's caches)
    for figures in cpu.values():
        figures.clear()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats):
        order = list(runs.items())
        for name, run in order if repeat % 2 == 0 else order[::-1]:
            rates[name].append(run())
    ratios = [w / p for w, p in zip(rates["worker"], rates["plain"], strict=True)]
    verified = [w / p for w, p in zip(rates["worker"], rates["verified"], strict=True)]
    return {
        "objects": len(manifest.shards),
        "at_once": at_once,
        "mib": total,
        "worker": statistics.median(rates["worker"]),
        "plain": statistics.median(rates["plain"]),
        "verified": statistics.median(rates["verified"]),
        "ratio": statistics.median(ratios),
        "ratio_verified": statistics.median(verified),
        "cpu": {name: statistics.median(figures) for name, figures in cpu.items()},
    }


# -- (b)-(d) through the service --------------------------------------------------------------
class DiskMeter(threading.Thread):
    """The bytes on disk (allocated blocks of unique inodes) under some directories, sampled
    every 20 ms; ``peak`` is the largest sample."""

    def __init__(self, *roots: Path) -> None:
        super().__init__(daemon=True)
        self.roots, self.peak, self.done = roots, 0, threading.Event()

    def sample(self) -> int:
        seen: dict[tuple[int, int], int] = {}
        for root in self.roots:
            for directory, _, files in os.walk(root):
                for name in files:
                    try:
                        info = os.lstat(os.path.join(directory, name))
                    except FileNotFoundError:
                        continue
                    seen[(info.st_dev, info.st_ino)] = info.st_blocks * 512
        return sum(seen.values())

    def run(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.sample())


def _job(client: ace3.Client, model: Any, dataset: Any, delay: float, **config: Any) -> Any:
    fields = {"num_gpus": 2, "validation_split": 0, "seed": 0, "learning_rate": 1e-3,
              "sequence_length": 1024, "batch_size": 256, **config}  # fmt: skip
    trainer = ace3.DistributedTrainer(ace3.TrainingConfig(**fields), client=client)
    result = trainer.train(model, dataset, model_kwargs={"delay": delay}, show_progress=None)
    return client.jobs.retrieve(result.job_id)


def first_step_seconds(client: ace3.Client, job: Any) -> float:
    first = min(m.created_at for m in client.jobs.metrics(job.id) if m.created_at is not None)
    started: datetime = job.started_at
    return wall(first) - wall(started)


def wait_share(client: ace3.Client, job: Any) -> tuple[float, float]:
    """(the largest rank's share of its time waiting for data over the steps after the first,
    the same over all steps)."""
    reports: dict[int, dict[str, float]] = {}
    for metric in client.jobs.metrics(job.id):
        reports.setdefault(metric.step, {})[metric.name] = metric.value
    steps = sorted(s for s, values in reports.items() if "data_wait_ms_rank0" in values)
    shares = []
    for skip_first in (True, False):
        worst = 0.0
        for rank in (0, 1):
            waited = busy = 0.0
            for previous, step in zip([0, *steps], steps, strict=False):
                if skip_first and step == 1:
                    continue
                span = step - previous
                waited += reports[step][f"data_wait_ms_rank{rank}"] * span
                busy += reports[step][f"step_time_ms_rank{rank}"] * span
            worst = max(worst, waited / (waited + busy))
        shares.append(worst)
    return shares[0], shares[1]


def through_service(
    store: ObjectStore, root: Path, args: argparse.Namespace, shard_bytes: int
) -> dict[str, Any]:
    cache, work = root / "node-cache", root / "work"
    bound = args.bound_mib * MiB
    env = {
        "ACE3_S3_ENDPOINT_URL": store.endpoint_url,
        "AWS_ACCESS_KEY_ID": store.access_key,
        "AWS_SECRET_ACCESS_KEY": store.secret_key,
        "AWS_REGION": "us-east-1",
        "ACE3_DATASET_SOURCES": f"s3://{BUCKET}/",
        "ACE3_DATASET_CACHE_DIR": str(cache),
        "ACE3_DATASET_CACHE_BYTES": str(bound),
        "ACE3_WORK_DIR": str(work),
        "ACE3_WORKER_DEVICE": "cpu",
        "ACE3_HEARTBEAT_SECONDS": "1",
    }
    (root / "probe.py").write_text(PROBE_MODEL)
    meter = DiskMeter(cache, work)
    out: dict[str, Any] = {"bound": bound, "shard": shard_bytes}
    with service(env) as (base_url, key), ace3.Client(api_key=key, base_url=base_url) as client:
        model = client.load_model(root / "probe.py")
        large = client.datasets.register(f"s3://{BUCKET}/large/", format="tokens")
        small = client.datasets.register(f"s3://{BUCKET}/small/", format="tokens")
        out["large"], out["small"] = large.dataset.size_bytes, small.dataset.size_bytes
        _job(client, model, small, 0.0, max_steps=2)  # (the first job pays one-time costs)
        meter.start()
        firsts: dict[str, list[float]] = {"small": [], "large": []}
        for repeat in range(args.repeats):
            pairs = (("small", small), ("large", large))
            for name, dataset in pairs if repeat % 2 == 0 else pairs[::-1]:
                shutil.rmtree(cache / dataset.sha256, ignore_errors=True)  # (cold: no job runs)
                wait_until_quiet()
                job = _job(client, model, dataset, 0.0, max_steps=3, batch_size=16)
                firsts[name].append(first_step_seconds(client, job))
        out["first_step"] = {name: statistics.median(v) for name, v in firsts.items()}
        out["first_steps"] = firsts
        out["waits"] = []
        for workers in args.loader_workers:
            wait_until_quiet()
            job = _job(client, model, large, 0.02, max_steps=args.steps, log_interval=25,
                       batch_size=args.batch_size, num_workers=workers)  # fmt: skip
            step_ms = statistics.median(
                m.value for m in client.jobs.metrics(job.id, name="step_time_ms_max") if m.step > 1
            )
            out["waits"].append((workers, step_ms, *wait_share(client, job)))
        wait_until_quiet()
        fast = _job(client, model, large, 0.0, max_steps=args.fast_steps, log_interval=50)
        out["fast"] = (0, 0.0, *wait_share(client, fast))
        out["fetched"] = sum(  # (the job's log gives each shard's sha256 once)
            "ace3: dataset shard" in line.line for line in client.jobs.iter_logs(fast.id)
        )
        meter.done.set()
        meter.join()
    out["peak"] = meter.peak
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shard-mib", type=int, default=10)
    parser.add_argument("--large-shards", type=int, default=200, help="the 2 GB dataset")
    parser.add_argument("--small-shards", type=int, default=2, help="the 20 MB dataset")
    parser.add_argument("--fetch-shards", type=int, default=24, help="(a): shards fetched")
    parser.add_argument("--fetch-mib", type=int, default=128, help="(a)'s large objects")
    parser.add_argument("--fetch-count", type=int, default=4)
    parser.add_argument("--fetch-repeats", type=int, default=5, help="(a)'s repeats")
    parser.add_argument("--bound-mib", type=int, default=200, help="ACE3_DATASET_CACHE_BYTES")
    parser.add_argument("--steps", type=int, default=800, help="(c)'s steps")
    parser.add_argument("--batch-size", type=int, default=32, help="(c)'s global batch")
    parser.add_argument(
        "--loader-workers",
        type=int,
        nargs="+",
        default=[0, 1],
        help="(c): a job for each num_workers",
    )
    parser.add_argument("--fast-steps", type=int, default=800, help="(d)'s fast job's steps")
    parser.add_argument("--tmp", default=None, help="where the temporary directory goes")
    parser.add_argument("--fetch-only", action="store_true", help="(a) alone, no service")
    args = parser.parse_args()
    shard = args.shard_mib * MiB
    for name in ("ACE3_BASE_URL", "ACE3_API_KEY"):  # (a service of its own, with its settings)
        os.environ.pop(name, None)
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="ace3-streams-") as tmp:
        root = Path(tmp)
        with seaweedfs(root / "seaweedfs") as store:
            os.environ.update({k: v for k, v in store.env(BUCKET).items() if k.startswith("AWS_")})
            import boto3

            s3 = boto3.client("s3", endpoint_url=store.endpoint_url, region_name="us-east-1")
            s3.create_bucket(Bucket=BUCKET)
            # (a) first, on objects of its own, once the upload is on disk (os.sync): the
            # dataset's 2 GB upload would leave the disk writing back while it is measured.
            upload(s3, "fetch-shards/", args.fetch_shards, shard)
            upload(s3, "fetch/", args.fetch_count, args.fetch_mib * MiB)
            os.sync()
            fetch = [
                fetch_throughput(store, "fetch-shards/", root, args.fetch_repeats),
                fetch_throughput(store, "fetch-shards/", root, args.fetch_repeats, at_once=4),
                fetch_throughput(store, "fetch/", root, args.fetch_repeats),
            ]
            if args.fetch_only:
                print_table(
                    f"\nshard fetches on SeaweedFS, {os.cpu_count()} CPUs", fetch_rows(fetch)
                )
                return 0
            started = time.monotonic()
            upload(s3, "small/", args.small_shards, shard)
            upload(s3, "large/", args.large_shards, shard)
            os.sync()
            print(f"uploaded the datasets in {time.monotonic() - started:.0f} s", flush=True)
            stacked = through_service(store, root, args, shard)
    report(fetch, stacked, args)
    return 0


Row = tuple[str, str, str, bool | None]


def fetch_rows(fetch: list[dict[str, Any]]) -> list[Row]:
    rows: list[Row] = []
    for figures in fetch:
        size = figures["mib"] / figures["objects"]
        rows.append((
            f"(a) fetch, {figures['objects']} objects of {size:.0f} MiB, {figures['at_once']} at "
            "a time: worker / boto3 MiB/s",
            f"{figures['worker']:.0f} / {figures['plain']:.0f} = {figures['ratio']:.2f}",
            ">= 0.8", figures["ratio"] >= 0.8,
        ))  # fmt: skip
        rows.append((
            "    the same against download_file + sha256 + fsync",
            f"{figures['worker']:.0f} / {figures['verified']:.0f} = "
            f"{figures['ratio_verified']:.2f}", "", None,
        ))  # fmt: skip
        used = figures["cpu"]
        rows.append((
            "    CPU-s per GiB in this process (medians): worker / boto3 / boto3 + sha256",
            f"{used['worker']:.2f} / {used['plain']:.2f} / {used['verified']:.2f}", "", None,
        ))  # fmt: skip
    return rows


def print_table(title: str, rows: list[Row]) -> None:
    width = max(len(row[0]) for row in rows)
    print(title)
    print(f"{'measure':<{width}}  {'result':<24}  {'goal':<14}  met")
    for label, result, goal, met in rows:
        verdict = "" if met is None else ("yes" if met else "NO")
        print(f"{label:<{width}}  {result:<24}  {goal:<14}  {verdict}")


def report(fetch: list[dict[str, Any]], out: dict[str, Any], args: argparse.Namespace) -> None:
    shard_mib = out["shard"] / MiB
    first = out["first_step"]
    gap = first["large"] - first["small"]
    rows = fetch_rows(fetch)
    rows.append((
        f"(b) first step s, {out['large'] / 1e9:.2f} GB / {out['small'] / 1e6:.0f} MB (medians)",
        f"{first['large']:.2f} / {first['small']:.2f} ({gap:+.2f})", "<= 2 s apart",
        abs(gap) <= 2.0,
    ))  # fmt: skip
    for workers, step_ms, share, with_first in out["waits"]:
        goal = workers == 0  # (a loader worker's batch costs a handoff: see the README)
        rows.append((
            f"(c) data wait share, ~{step_ms:.0f} ms steps, batch {args.batch_size}, "
            f"num_workers={workers} (after step 1; all)",
            f"{share:.1%} ({with_first:.1%})", "<= 5%" if goal else "",
            share <= 0.05 if goal else None,
        ))  # fmt: skip
    _, _, fast, fast_all = out["fast"]
    rows.append(("    steps as fast as they go (no sleep), batch 256, num_workers=0",
                 f"{fast:.1%} ({fast_all:.1%})", "", None))  # fmt: skip
    limit = out["bound"] + 2 * out["shard"]
    rows.append((
        f"(d) peak cache disk MiB, bound {out['bound'] / MiB:.0f} + 2 shards of {shard_mib:.0f}",
        f"{out['peak'] / MiB:.1f}", f"<= {limit / MiB:.0f}", out["peak"] <= limit,
    ))  # fmt: skip
    rows.append((f"    (the fast job alone read {out['fetched']} shards, "
                 f"{out['fetched'] * shard_mib:.0f} MiB, through the cache)", "", "", None))  # fmt: skip
    print_table(
        f"\nstreamed datasets on SeaweedFS, 2 gloo ranks on {os.cpu_count()} CPUs, "
        f"{args.repeats} repeats",
        rows,
    )
    print("(b) each run:", {k: [round(v, 2) for v in vs] for k, vs in out["first_steps"].items()})


if __name__ == "__main__":
    sys.exit(main())
