"""Hostile model files: each tries one attack from its ``build_model`` and prints a verdict line.

``ACE3-ATTACK <name>: blocked <detail>`` when the sandbox stopped it, ``ACE3-ATTACK <name>:
SUCCEEDED <detail>`` when it got through. The tests read the verdicts from the job's logs (and
check the service's side of each attack themselves). Every model ends by returning a tiny
classifier for the digits data, so a job whose attack was blocked trains and succeeds.
"""

from __future__ import annotations

import re

PRELUDE = """
import json, os, socket, sys

import torch


def verdict(name, blocked, detail=""):
    state = "blocked" if blocked else "SUCCEEDED"
    print(f"ACE3-ATTACK {name}: {state} {detail}"[:2000], flush=True)


def job_spec():
    return json.loads(open(sys.argv[sys.argv.index("--job") + 1]).read())


def tiny_model():
    return torch.nn.Linear(64, 10)
"""

# Every process this job can see: no service secret in any environment or command line.
ENVIRON = """
SECRETS = ("ACE3_DATABASE_URL", "ACE3_BROKER_URL", "ACE3_STORAGE_DIR", "ACE3_DATA_DIR",
           "postgresql://", "redis://")


def attack_environ(**kwargs):
    found = [key for key in os.environ if key.startswith("ACE3_")
             and key not in ("ACE3_DEVICE", "ACE3_JOB_ID")]
    seen = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        seen += 1
        for part in ("environ", "cmdline"):
            try:
                data = open(f"/proc/{pid}/{part}", "rb").read()
            except OSError:
                continue
            found += [f"{pid}/{part}:{s}" for s in SECRETS if s.encode() in data]
    parent = os.getppid()
    while parent > 1:  # and up the chain of parents explicitly
        try:
            data = open(f"/proc/{parent}/environ", "rb").read()
            found += [f"parent {parent}:{s}" for s in SECRETS if s.encode() in data]
            stat = open(f"/proc/{parent}/stat").read()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    verdict("environ", not found, f"processes seen={seen} found={found[:5]}")
"""

# The database and the broker (and the API) over the network.
NETWORK = """
def attack_network(targets=(), **kwargs):
    reached = []
    for host, port in targets:
        try:
            with socket.create_connection((host, int(port)), timeout=3):
                reached.append(f"{host}:{port}")
        except OSError:
            pass
    verdict("network", not reached, f"reached={reached}")
"""

# The service's files: another owner's dataset (by its content), the store, the database file.
FILES = """
def attack_files(data_dir="", marker="", **kwargs):
    leaks = []
    for root, _dirs, names in os.walk(data_dir):
        for name in names:
            path = os.path.join(root, name)
            try:
                with open(path, "rb") as handle:
                    data = handle.read(1 << 20)
            except OSError:
                continue
            if marker.encode() in data or name.startswith("ace3.db"):
                leaks.append(path)
    listed = os.path.isdir(data_dir) and bool(os.listdir(data_dir))
    verdict("files", not leaks, f"data dir listed={listed} leaks={leaks[:5]}")
"""

# The job's own inputs: model code and training data must be read-only copies.
INPUTS = """
def attack_inputs(**kwargs):
    spec = job_spec()
    written = []
    for path in (spec["dataset"]["path"], spec["model"]["path"], sys.argv[sys.argv.index("--job") + 1]):
        try:
            with open(path, "ab") as handle:
                handle.write(b"corrupted by the job")
            written.append(path)
        except OSError:
            pass
        try:
            os.chmod(path, 0o666)
            written.append(f"chmod {path}")
        except OSError:
            pass
    verdict("inputs", not written, f"written={written}")
"""

# The attacks above, as one model: ``model_kwargs={"attacks": [...], ...}`` picks them.
PROBES = (
    ENVIRON
    + NETWORK
    + FILES
    + INPUTS
    + """

def build_model(attacks=(), **kwargs):
    for name in attacks:
        globals()[f"attack_{name}"](**kwargs)
    return tiny_model()
"""
)

# Forged checkpoint records: a file outside the job (to be copied out and deleted), a step far
# beyond the plan, a link out of the checkpoint directory. Written once training has started
# (from the first forward pass), so the run's plan is known.
CHECKPOINTS = """
import hashlib

FORGED = {"done": False}


class Forger(torch.nn.Module):
    def __init__(self, victim):
        super().__init__()
        self.victim = victim
        self.linear = torch.nn.Linear(64, 10)

    def forward(self, x):
        if not FORGED["done"]:
            FORGED["done"] = True
            forge(self.victim)
        return self.linear(x)


def record(path, name, step, data):
    return {"type": "checkpoint", "step": step, "epoch": 1, "name": name, "path": path,
            "sha256": hashlib.sha256(data).hexdigest(), "size_bytes": len(data), "metrics": {}}


def forge(victim):
    output = job_spec()["output_dir"]
    checkpoints = os.path.join(output, "checkpoints")
    os.makedirs(checkpoints, exist_ok=True)
    lines = []
    try:
        secret = open(victim, "rb").read()
        print("could read the victim file", flush=True)
    except OSError:
        secret = b"what the victim file is believed to hold"
    lines.append(record(victim, "step-00000002.pt", 2, secret))
    real = b"forged weights"
    with open(os.path.join(checkpoints, "step-99999999.pt"), "wb") as handle:
        handle.write(real)
    lines.append(record(os.path.join(checkpoints, "step-99999999.pt"), "step-99999999.pt",
                        99999999, real))
    os.symlink(victim, os.path.join(checkpoints, "step-00000000.pt"))  # (no step the run saves)
    lines.append(record(os.path.join(checkpoints, "step-00000000.pt"), "step-00000000.pt", 0,
                        secret))
    lines.append({"type": "checkpoint", "step": 1, "name": "../../x", "path": "/etc/passwd"})
    with open(os.path.join(output, "events.jsonl"), "a") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\\n")
    verdict("checkpoints", True, "forged records written; the worker must refuse them")


def build_model(victim="", **kwargs):
    return Forger(victim)
"""

# A fork bomb, bounded so that a broken sandbox does not take the test machine down.
FORK_BOMB = """
import time


def build_model(tries=1500, **kwargs):
    started = 0
    try:
        for _ in range(tries):
            if os.fork() == 0:
                time.sleep(600)
                os._exit(0)
            started += 1
    except BlockingIOError:
        verdict("fork bomb", True, f"stopped after {started} processes")
        raise
    verdict("fork bomb", False, f"started {started} processes")
    return tiny_model()
"""

SLEEPER = """
import time


def build_model(**kwargs):
    print("sleeping forever", flush=True)
    time.sleep(3600)
    return tiny_model()
"""

FLOOD = """
def build_model(megabytes=100, **kwargs):
    line = "x" * 999
    for index in range(megabytes * 1000):
        print(line)
    sys.stdout.flush()
    return tiny_model()
"""

# Ranks that get SIGTERM say so and keep going (so the kill must come); a detached grandchild
# in its own session must not survive the job.
SIGNALS = """
import signal, subprocess, time


def build_model(marker="", **kwargs):
    rank = os.environ.get("RANK")

    def on_term(signum, frame):
        print(f"rank {rank} got SIGTERM", flush=True)

    signal.signal(signal.SIGTERM, on_term)
    subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(600)  # {marker}"],
                     start_new_session=True, stdin=subprocess.DEVNULL)
    print(f"rank {rank} ready", flush=True)
    while True:
        time.sleep(0.2)
"""

# Fills its temporary directory as fast as it can, in files smaller than the job's disk limit
# (a file's own size limit, RLIMIT_FSIZE, is that limit too), saying how much it wrote by when;
# it gives up at `megabytes` (a worker that does not stop it must not fill the test machine).
DISK_FILLER = """
import time


def build_model(megabytes_per_file=8, megabytes=2048, **kwargs):
    block = b"\\xa5" * (1 << 20)
    written, started = 0, time.monotonic()
    for index in range(megabytes // megabytes_per_file):
        with open(os.path.join(os.environ["TMPDIR"], f"fill-{index}"), "wb") as file:
            for _ in range(megabytes_per_file):
                file.write(block)
        written += megabytes_per_file << 20
        print(f"ACE3-FILL {written} {time.monotonic() - started:.6f}", flush=True)
    return tiny_model()
"""

# Every rank holds `megabytes` it wrote (less than each process may allocate), one rank after
# the other (rank 0 first: it says so in a file of the node's /tmp), for `seconds`.
MEMORY_HOG = """
import time


def build_model(megabytes=0, seconds=60, **kwargs):
    rank = int(os.environ.get("RANK", "0"))
    marker = os.path.join(os.environ["TMPDIR"], f"rank-{rank - 1}-holds")
    while rank > 0 and not os.path.exists(marker):
        time.sleep(0.05)
    held = b"\\x01" * (megabytes << 20)
    print(f"rank {rank} holds {len(held) >> 20} MiB", flush=True)
    open(os.path.join(os.environ["TMPDIR"], f"rank-{rank}-holds"), "w").close()
    time.sleep(seconds)
    return tiny_model()
"""


def model_source(attack: str) -> str:
    return PRELUDE + attack


VERDICT = re.compile(r"ACE3-ATTACK (?P<name>[\w ]+): (?P<state>blocked|SUCCEEDED) ?(?P<detail>.*)")


def verdicts(lines: list[str]) -> dict[str, tuple[str, str]]:
    """``{attack: (state, detail)}`` from a job's log lines."""
    found = {}
    for line in lines:
        match = VERDICT.search(line)
        if match:
            found[match["name"]] = (match["state"], match["detail"])
    return found
