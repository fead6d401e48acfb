"""Importing the SDK must not import torch (users install it without the [train] extra)."""

from __future__ import annotations

import subprocess
import sys

import pytest

# httpx, pydantic and rich, and what they import in turn (pydantic and rich load lazily).
SDK_DEPENDENCIES = {
    "ace3",
    "httpx",
    "httpcore",
    "h11",
    "anyio",
    "sniffio",
    "idna",
    "certifi",
    "pydantic",
    "pydantic_core",
    "annotated_types",
    "typing_extensions",
    "typing_inspection",
    "rich",
    "markdown_it",
    "mdurl",
    "pygments",
}


@pytest.mark.parametrize(
    "module",
    ["ace3", "ace3.cli", "ace3_server", "ace3_server.app", "ace3_worker", "ace3_worker.tasks"],
)
def test_import_leaves_torch_out_of_sys_modules(module: str):
    code = (
        f"import sys, {module}\n"
        "assert 'torch' not in sys.modules, sorted(n for n in sys.modules if 'torch' in n)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_sdk_imports_only_stdlib_httpx_pydantic_and_rich():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import httpx, pydantic\n"
        "baseline = set(sys.modules)\n"
        "import ace3, ace3.follow.job_display\n"
        "new = {name.split('.')[0] for name in set(sys.modules) - baseline}\n"
        f"allowed = {sorted(SDK_DEPENDENCIES)!r}\n"
        "allowed = set(allowed) | set(sys.stdlib_module_names)\n"
        "extra = sorted(name for name in new if name not in allowed and not name.startswith('_'))\n"
        "assert not extra, extra\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_one_version_source_and_typed_packages() -> None:
    """The version comes from the distribution's metadata alone (pyproject.toml); every
    package declares itself typed."""
    from importlib.metadata import version
    from pathlib import Path

    import ace3
    import ace3_server
    import ace3_worker
    from ace3.client._http import USER_AGENT

    assert ace3.__version__ == ace3_server.__version__ == version("ace3")
    assert f"ace3-python/{version('ace3')}" == USER_AGENT
    for package in (ace3, ace3_server, ace3_worker):
        assert (Path(package.__file__).parent / "py.typed").is_file(), package.__name__


def test_every_module_of_the_torch_free_packages_leaves_torch_out():
    """Not only the package roots: every module of config/, client/, follow/, trainers/ and the
    top-level ones, imported together in one fresh interpreter."""
    code = (
        "import importlib, pkgutil, sys\n"
        "import ace3\n"
        "names = ['ace3.errors', 'ace3.files', 'ace3.hp', 'ace3.utils', 'ace3.cli']\n"
        "for package in ('config', 'client', 'follow', 'trainers'):\n"
        "    module = importlib.import_module('ace3.' + package)\n"
        "    names += [info.name for info in pkgutil.walk_packages(module.__path__, module.__name__ + '.')]\n"
        "for name in names:\n"
        "    importlib.import_module(name)\n"
        "assert len(names) > 25, names\n"
        "assert 'torch' not in sys.modules, sorted(n for n in sys.modules if 'torch' in n)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_module_paths_of_earlier_releases_still_import():
    """Jobs stored by an earlier SDK carry callbacks as source with ``from ace3.callbacks import
    ...``; user scripts import ``ace3.optimizers``. Both load today's modules, lazily."""
    code = (
        "import sys, ace3\n"
        "assert 'torch' not in sys.modules\n"
        "exec('from ace3.callbacks import EarlyStopping as EarlyStopping')\n"
        "import ace3.callbacks, ace3.training.callbacks\n"
        "assert ace3.callbacks is ace3.training.callbacks\n"
        "assert ace3.training.callbacks.__spec__.name == 'ace3.training.callbacks'\n"
        "from ace3.optimizers import Adam8bit\n"
        "from ace3.schedulers import WarmupCosineScheduler\n"
        "import ace3.data, ace3.amp, ace3.loggers, ace3.profiling, ace3.checkpoint_files\n"
        "assert ace3.optimizers.Adam8bit is Adam8bit\n"
        "try:\n"
        "    import ace3.no_such_module\n"
        "except ModuleNotFoundError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('an unknown name imported')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
