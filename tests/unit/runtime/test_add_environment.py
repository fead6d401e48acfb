"""A job's environment is appended to ``sys.path`` after the worker's packages, whatever its
``.pth`` files do: a wheel whose ``.pth`` inserts its own directory first (with a numpy and a
torch of its own in it) cannot shadow the worker's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SHADOW = "raise ImportError('the environment shadowed the worker')\n"


def test_a_pth_that_puts_itself_first_is_put_back_behind_the_workers_packages(
    tmp_path: Path,
) -> None:
    env = tmp_path / "env"
    vendored = env / "_vendored"
    for name in ("numpy", "torch", "extra_only_here"):
        (vendored / name).mkdir(parents=True)
    (vendored / "numpy" / "__init__.py").write_text(SHADOW)
    (vendored / "torch" / "__init__.py").write_text(SHADOW)
    (vendored / "extra_only_here" / "__init__.py").write_text("VALUE = 7\n")
    (env / "zz-first.pth").write_text(f"import sys; sys.path.insert(0, {str(vendored)!r})\n")
    script = f"""
import json, sys
from ace3.runtime.__main__ import add_environment
before = list(sys.path)
add_environment({str(env)!r})
import numpy, torch, extra_only_here
print(json.dumps({{
    "numpy": numpy.__file__, "torch": torch.__file__, "extra": extra_only_here.VALUE,
    "kept_first": sys.path[: len(before)] == before,
    "tail": sys.path[len(before):],
}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert not seen["numpy"].startswith(str(env)) and not seen["torch"].startswith(str(env))
    assert seen["extra"] == 7, "the environment's own modules are importable"
    assert seen["kept_first"], "the worker's entries stay first, in their order"
    assert sorted(seen["tail"]) == sorted([str(env), str(vendored)])
