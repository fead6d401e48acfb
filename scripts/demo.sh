#!/usr/bin/env bash
# make demo: start ACE3 on the embedded defaults (SQLite, a local broker), create a key, and train
# the digits example through the SDK with 2 processes. Stops everything it started on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export ACE3_DATA_DIR="$PWD/.ace3/demo"
rm -rf "$ACE3_DATA_DIR"
mkdir -p "$ACE3_DATA_DIR"
PORT=${ACE3_DEMO_PORT:-$($BIN/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
export ACE3_BASE_URL="http://127.0.0.1:$PORT"
SECONDS=0
if [ -z "${ACE3_SANDBOX:-}" ] && ! command -v bwrap >/dev/null; then
  # The demo trains our own example; a worker for other people's code needs the sandbox.
  echo "note: bubblewrap is not installed, so this demo's jobs run unsandboxed (your own code only;"
  echo "      install it for the job sandbox: sudo apt-get install bubblewrap; see docs/security.md)"
  export ACE3_SANDBOX=none
fi

$BIN/ace3 up --port "$PORT" > "$ACE3_DATA_DIR/stack.log" 2>&1 &
STACK_PID=$!
cleanup() {
  kill "$STACK_PID" 2>/dev/null || true
  wait "$STACK_PID" 2>/dev/null || true
}
trap cleanup EXIT

echo "Starting ACE3 (API + worker) on $ACE3_BASE_URL; logs in $ACE3_DATA_DIR/stack.log"
healthy() { $BIN/python -c 'import os, sys, httpx
try: sys.exit(httpx.get(os.environ["ACE3_BASE_URL"] + "/healthz", timeout=2).status_code != 200)
except httpx.HTTPError: sys.exit(1)'; }
for _ in $(seq 1 120); do
  healthy && break
  kill -0 "$STACK_PID" 2>/dev/null || { cat "$ACE3_DATA_DIR/stack.log"; exit 1; }
  sleep 0.5
done
healthy || { echo "ACE3 did not come up"; cat "$ACE3_DATA_DIR/stack.log"; exit 1; }

export ACE3_API_KEY=$($BIN/ace3 keys create --name demo --quiet)
cd examples/digits
../../$BIN/python train.py

echo "demo wall time (stack start to trained model): ${SECONDS} s"
