#!/usr/bin/env bash
# The GPU checks: every test marked `gpu` (tests/gpu) on a machine with a CUDA GPU, the install of
# what that machine lacks included, within one time bound. docs/gpu-check.md says what each
# check covers and how to run this with the session's `device` tool.
#
#   scripts/gpu-check.sh --prepare   here, where pip and apt reach their registries: fetch what the
#                                    GPU machine lacks into .gpu-carry/ (pinned wheels, bubblewrap)
#   scripts/gpu-check.sh             on the GPU machine, from the repository root: install what
#                                    .gpu-carry/ holds, run the checks, summarise; without a CUDA
#                                    device every check is collected and skipped (exit 3)
#   scripts/gpu-check.sh --dry-run   anywhere: what it would install and run; installs and runs
#                                    nothing
#   scripts/gpu-check.sh --list      the checks, one test id per line
#
# Environment: GPU_CHECK_BUDGET_S (480: the whole run's bound, install included),
# GPU_CHECK_TEST_TIMEOUT_S (300: one test's, where pytest-timeout is installed), GPU_CHECK_PYTHON
# (.venv/bin/python when it exists, else python3), GPU_CHECK_TESTS (tests/gpu),
# GPU_CHECK_CARRY (.gpu-carry), GPU_CHECK_DEVICE_PYTHON (3.12: the GPU machine's Python, for
# --prepare), GPU_CHECK_INSTALL (auto: install what is carried only where a CUDA device is seen;
# yes; no), OUT (where the log, the JUnit XML and the summary go; default /tmp/gpu-check).
# Exit: 0 every check passed or was skipped with its reason on a CUDA machine; 1 a check failed;
# 2 bad usage or a failed install; 3 no CUDA device; 124 the run outlasted GPU_CHECK_BUDGET_S.
set -euo pipefail

START=$SECONDS
cd "$(dirname "$0")/.."
ROOT=$PWD
BUDGET=${GPU_CHECK_BUDGET_S:-480}
TEST_TIMEOUT=${GPU_CHECK_TEST_TIMEOUT_S:-300}
TESTS=${GPU_CHECK_TESTS:-tests/gpu}
CARRY=${GPU_CHECK_CARRY:-.gpu-carry}
DEVICE_PYTHON=${GPU_CHECK_DEVICE_PYTHON:-3.12}
OUT_DIR=${OUT:-/tmp/gpu-check}
SUMMARY_MARGIN=10  # seconds kept for the summary after pytest
KILL_AFTER=5       # seconds between pytest's SIGTERM at the bound and its SIGKILL
# 8-bit Adam's CUDA kernels; only the libraries for CUDA 13 travel (torch 2.11+cu130 there).
BITSANDBYTES=bitsandbytes==0.50.2
BITSANDBYTES_LIBS='bitsandbytes/libbitsandbytes_cpu.so bitsandbytes/libbitsandbytes_cuda13*.so'
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  PYTHON=$GPU_CHECK_PYTHON
elif [ -x .venv/bin/python ]; then
  PYTHON=.venv/bin/python
else
  PYTHON=python3
fi

say() { printf 'gpu-check: %s\n' "$*"; }
die() { printf 'gpu-check: %s\n' "$*" >&2; exit "${2:-2}"; }
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }

MODE=run
case "${1:-}" in
  "") ;;
  --prepare) MODE=prepare ;;
  --dry-run) MODE=dry ;;
  --list) MODE=list ;;
  -h|--help) usage; exit 0 ;;
  *) usage >&2; die "unknown argument: $1" ;;
esac
[ $# -le 1 ] || { usage >&2; die "one argument at most"; }
case "$BUDGET" in ''|*[!0-9]*) die "GPU_CHECK_BUDGET_S must be a number of seconds, not '$BUDGET'" ;; esac

# --- prepare (here) -------------------------------------------------------------------------------
prepare() {
  local platforms=() n
  for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
  platforms+=(--platform manylinux2014_x86_64)
  rm -rf "$CARRY"
  mkdir -p "$CARRY/wheels" "$CARRY/optional" "$CARRY/debs"
  say "wheels for Python $DEVICE_PYTHON (scripts/gpu-check-wheels.txt)"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON" \
    --implementation cp "${platforms[@]}" -d "$CARRY/wheels" -r scripts/gpu-check-wheels.txt
  say "$BITSANDBYTES, with its CUDA 13 libraries only"
  if python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$DEVICE_PYTHON" \
      --implementation cp "${platforms[@]}" -d "$CARRY/optional" "$BITSANDBYTES"; then
    local wheel
    for wheel in "$CARRY"/optional/bitsandbytes-*.whl; do
      # shellcheck disable=SC2086  # (the library patterns are globs for the trimmer)
      python3 scripts/gpu_check_trim_wheel.py "$wheel" $BITSANDBYTES_LIBS
    done
  else
    say "bitsandbytes not fetched: its check will be skipped there"
  fi
  say "bubblewrap (the workers' job sandbox), a Debian package for amd64"
  if [ "$(dpkg --print-architecture 2>/dev/null || true)" = amd64 ] \
      && (cd "$CARRY/debs" && apt-get download bubblewrap >/dev/null 2>&1); then
    ls "$CARRY/debs"
  else
    say "bubblewrap not fetched (needs apt on amd64; run apt-get update first): the sandbox checks will be skipped there"
  fi
  case "$CARRY" in
    /*) say "note: the device tool carries paths inside the repository only, not $CARRY" ;;
    *) git check-ignore -q "$CARRY" \
         || say "warning: $CARRY is not ignored by git: it would travel uncarried and could be committed" ;;
  esac
  du -sh "$CARRY"
  say "then, in a session with a device: the run tool with carry [\"$CARRY\"] and the command in docs/gpu-check.md"
}

# --- what this machine has ------------------------------------------------------------------------
preflight() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader \
      | sed 's/^/gpu-check: nvidia-smi: /' || say "nvidia-smi: no answer"
  else
    say "nvidia-smi: not found"
  fi
  command -v "$PYTHON" >/dev/null 2>&1 || [ -x "$PYTHON" ] || die "no Python at $PYTHON (set GPU_CHECK_PYTHON)"
  CUDA=$("$PYTHON" - <<'PY' || true
import importlib.util, platform
try:
    import torch
except Exception as exc:
    print(f"gpu-check: python {platform.python_version()}: torch does not import ({exc})")
    print("no")
    raise SystemExit(0)
cuda = torch.cuda.is_available()
print(f"gpu-check: python {platform.python_version()}, torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}), CUDA device: "
      + (f"{torch.cuda.get_device_name(0)}, capability {torch.cuda.get_device_capability(0)}"
         if cuda else "none"))
have = {name: importlib.util.find_spec(name) is not None
        for name in ("pynvml", "bitsandbytes", "pytest_timeout", "pydantic", "sqlalchemy")}
print("gpu-check: importable: " + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in have.items()))
print("yes" if cuda else "no")
PY
)
  printf '%s\n' "$CUDA" | sed '$d'
  CUDA=$(printf '%s\n' "$CUDA" | tail -n 1)
  if command -v bwrap >/dev/null 2>&1; then say "bubblewrap: $(command -v bwrap)"; else say "bubblewrap: not on PATH"; fi
}

# --- install (the GPU machine) --------------------------------------------------------------------
SITE=""
site_packages() { SITE=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); }

install_carried() {
  local dry=$1 wheels=() optional=() debs=()
  shopt -s nullglob
  wheels=("$CARRY"/wheels/*.whl)
  optional=("$CARRY"/optional/*.whl)
  debs=("$CARRY"/debs/bubblewrap_*.deb)
  shopt -u nullglob
  site_packages
  if [ ${#wheels[@]} -eq 0 ]; then
    say "install: no wheels carried in $CARRY/wheels (scripts/gpu-check.sh --prepare makes them)"
  elif [ "$dry" = yes ]; then
    say "would install into $SITE: ${wheels[*]##*/}"
  else
    say "installing ${#wheels[@]} carried wheels into $SITE"
    pip_install "${wheels[@]}" || die "the carried wheels did not install"
  fi
  local wheel
  for wheel in "${optional[@]}"; do
    if [ "$dry" = yes ]; then
      say "would install (optional) ${wheel##*/}"
    elif ! pip_install "$wheel"; then
      say "optional ${wheel##*/} did not install: its check will be skipped"
    fi
  done
  if command -v bwrap >/dev/null 2>&1; then
    :
  elif [ ${#debs[@]} -eq 0 ]; then
    say "bubblewrap: neither installed nor carried: the sandbox checks will be skipped"
  elif [ "$dry" = yes ]; then
    say "would unpack ${debs[0]##*/} into /tmp/gpu-check-root (bwrap on PATH)"
  else
    mkdir -p /tmp/gpu-check-root
    dpkg -x "${debs[0]}" /tmp/gpu-check-root
    export PATH="/tmp/gpu-check-root/usr/bin:$PATH"
    if bwrap --version >/dev/null 2>&1; then
      say "bubblewrap: unpacked, $(bwrap --version)"
    else
      say "bubblewrap: unpacked but does not run here: the sandbox checks will be skipped"
    fi
  fi
  # The project itself, as an editable install would put it: a .pth file naming its source trees
  # (the sandboxed job's isolated interpreter finds ace3 through it, as on a worker).
  if "$PYTHON" -I -c 'import ace3, ace3_worker' >/dev/null 2>&1; then
    say "the project: already importable ($("$PYTHON" -I -c 'import ace3; print(ace3.__file__)'))"
  elif [ "$dry" = yes ]; then
    say "would write $SITE/ace3-gpu-check.pth naming $ROOT/{sdk,control,server,workers}"
  elif printf '%s\n' "$ROOT/sdk" "$ROOT/control" "$ROOT/server" "$ROOT/workers" \
      > "$SITE/ace3-gpu-check.pth" 2>/dev/null; then
    say "the project: importable through $SITE/ace3-gpu-check.pth"
  else
    export PYTHONPATH="$ROOT/sdk:$ROOT/control:$ROOT/server:$ROOT/workers${PYTHONPATH:+:$PYTHONPATH}"
    say "the project: on PYTHONPATH ($SITE is read-only: the sandbox checks will be skipped)"
  fi
  [ "$dry" = yes ] || "$PYTHON" -c 'import ace3, ace3_control, ace3_worker.sandbox.launch' \
    || die "the project does not import after the install (a dependency missing from $CARRY?)"
}

# Into the interpreter's own site-packages (where the sandboxed job's isolated interpreter looks
# too); where that is read-only, into /tmp/gpu-check-site on PYTHONPATH.
pip_install() {
  local args=(--quiet --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check)
  "$PYTHON" -m pip install "${args[@]}" "$@" 2>/dev/null && return 0
  say "$SITE refused the install: installing into /tmp/gpu-check-site instead"
  "$PYTHON" -m pip install "${args[@]}" --target /tmp/gpu-check-site "$@" || return 1
  case ":${PYTHONPATH:-}:" in *:/tmp/gpu-check-site:*) ;; *)
    export PYTHONPATH="/tmp/gpu-check-site${PYTHONPATH:+:$PYTHONPATH}" ;; esac
}

# --- the checks -----------------------------------------------------------------------------------
list_checks() {
  "$PYTHON" -m pytest --collect-only -q -m gpu -p no:cacheprovider "$TESTS" 2>/dev/null | grep '::' || true
}

run_checks() {
  mkdir -p "$OUT_DIR"
  local log="$OUT_DIR/gpu-check.log" junit="$OUT_DIR/gpu-check-junit.xml"
  local left=$((BUDGET - (SECONDS - START) - SUMMARY_MARGIN - KILL_AFTER))
  [ "$left" -ge 5 ] || die "no time left for the checks ($((SECONDS - START)) s of GPU_CHECK_BUDGET_S=$BUDGET spent)" 124
  local timeout_args=()
  if "$PYTHON" -c 'import pytest_timeout' >/dev/null 2>&1; then
    timeout_args=(--timeout="$TEST_TIMEOUT")
  fi
  rm -f "$junit"
  say "pytest -m gpu $TESTS, bounded at ${left} s (log: $log)"
  local rc=0
  set +e
  PYTHONUNBUFFERED=1 timeout --kill-after="$KILL_AFTER" "$left" \
    "$PYTHON" -m pytest -m gpu -p no:cacheprovider -o addopts= -rA -W ignore::pytest.PytestConfigWarning \
    "${timeout_args[@]}" --junitxml="$junit" "$TESTS" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    say "the checks ran past their time bound (${left} s of GPU_CHECK_BUDGET_S=$BUDGET): see $log"
    rc=124
  fi
  if [ -f "$junit" ]; then
    "$PYTHON" scripts/gpu_check_summary.py "$junit" | tee "$OUT_DIR/gpu-check-summary.txt"
  else
    say "no JUnit report: pytest did not finish" | tee "$OUT_DIR/gpu-check-summary.txt"
  fi
  say "took $((SECONDS - START)) s of $BUDGET s"
  return "$rc"
}

case "$MODE" in
  prepare) prepare ;;
  list) list_checks ;;
  dry)
    preflight
    install_carried yes
    say "would run: $PYTHON -m pytest -m gpu $TESTS, bounded at $BUDGET s in all"
    while IFS= read -r check; do
      if [ "$CUDA" = yes ]; then say "would run $check"; else say "$check: skipped: no CUDA device"; fi
    done < <(list_checks)
    ;;
  run)
    preflight
    case "${GPU_CHECK_INSTALL:-auto}" in
      yes) install_carried no ;;
      no) say "GPU_CHECK_INSTALL=no: nothing installed" ;;
      *)
        if [ "$CUDA" = yes ]; then
          install_carried no
        else
          say "no CUDA device: nothing installed; every check will be skipped"
        fi ;;
    esac
    rc=0
    run_checks || rc=$?
    if [ "$rc" -eq 0 ] && [ "$CUDA" != yes ]; then
      say "no CUDA device here: nothing was checked (run it on a GPU machine: docs/gpu-check.md)"
      exit 3
    fi
    [ "$rc" -ne 5 ] || { say "no check was collected from $TESTS"; exit 1; }
    exit "$rc"
    ;;
esac
