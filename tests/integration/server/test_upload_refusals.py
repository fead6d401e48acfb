"""Refused at the door (issue 30, point 3): a model file without its factory, an empty one, and
dataset files the engine would certainly fail on are each a 422 on ``["body", "file"]`` naming
the file and the problem, and nothing is stored: no row, no storage object, no staging file."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.conftest import Stack


@pytest.fixture(scope="module")
def owner(stack: Stack) -> Iterator[httpx.Client]:
    key, _ = stack.create_key("upload-refusals")
    with httpx.Client(
        base_url=stack.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        yield client


def _storage_files(stack: Stack) -> list[Path]:
    root = stack.root / "storage"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _pt(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _package(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _refused(
    stack: Stack, owner: httpx.Client, path: str, upload: dict[str, object], reason: str
) -> None:
    before_files = _storage_files(stack)
    before_rows = owner.get(path, params={"limit": 200}).json()["data"]
    response = owner.post(path, **upload)  # type: ignore[arg-type]
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", "file"]
    assert reason in error["msg"], error["msg"]
    assert owner.get(path, params={"limit": 200}).json()["data"] == before_rows
    assert _storage_files(stack) == before_files


@pytest.mark.parametrize(
    ("upload", "reason"),
    [
        ({"files": {"file": ("empty.py", b"")}}, "empty.py is empty"),
        ({"files": {"file": ("blank.py", b"  \n# nothing\n")}}, "blank.py is empty"),
        (
            {"files": {"file": ("nofactory.py", b"class Net:\n    pass\n")}},
            "nofactory.py defines no 'build_model' at module level",
        ),
        (
            {
                "files": {"file": ("named.py", b"def build_model(): ...\n")},
                "data": {"factory": "Net"},
            },
            "named.py defines no 'Net'",
        ),
        (
            {
                "files": {"file": ("pkg.tar.gz", _package({"pkg/model.py": b"def make(): ...\n"}))},
                "data": {"entry_module": "pkg.model"},
            },
            "pkg.tar.gz: pkg/model.py defines no 'build_model'",
        ),
    ],
)
def test_a_model_that_cannot_give_its_factory_is_422_and_not_stored(
    stack: Stack, owner: httpx.Client, upload: dict[str, object], reason: str
) -> None:
    _refused(stack, owner, "/v1/models", upload, reason)


def test_a_package_importing_its_factory_from_a_submodule_is_accepted(owner: httpx.Client) -> None:
    archive = _package(
        {
            "pkg/__init__.py": b"from .net import build_model\n",
            "pkg/net.py": b"def build_model(): ...\n",
        }
    )
    response = owner.post(
        "/v1/models", files={"file": ("pkg.tar.gz", archive)}, data={"entry_module": "pkg"}
    )
    assert response.status_code in (200, 201), response.text


@pytest.mark.parametrize(
    ("name", "body", "reason"),
    [
        ("corrupt.npz", b"PK\x03\x04 not really a zip", "corrupt.npz: not a readable .npz"),
        ("keys.npz", _npz(a=np.ones(3), b=np.ones(3)), "keys.npz: expected arrays inputs/targets"),
        ("short.csv", b"a,b\n1,2\n3\n", "short.csv: line 3 has 1 cells"),
        ("words.jsonl", b'{"words": "hello"}\n', 'words.jsonl: line 1: expected {"inputs"'),
        ("shape.pt", _pt({"a": torch.ones(2)}), "shape.pt: expected keys inputs/targets"),
        ("garbage.pt", b"\x00" * 64, "garbage.pt: not a torch.save file"),
    ],
)
def test_a_dataset_the_engine_cannot_read_is_422_and_not_stored(
    stack: Stack, owner: httpx.Client, name: str, body: bytes, reason: str
) -> None:
    _refused(stack, owner, "/v1/datasets", {"files": {"file": (name, body)}}, reason)


def test_a_directorys_data_file_is_checked_too(stack: Stack, owner: httpx.Client) -> None:
    archive = _package({"train.csv": b"a,b\n1,x\n"})
    upload = {"files": {"file": ("d.tar.gz", archive)}, "data": {"kind": "directory"}}
    _refused(stack, owner, "/v1/datasets", upload, "d.tar.gz: train.csv: line 2, column 'b'")


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("ok.npz", _npz(x=np.ones((4, 2)), y=np.arange(4))),
        ("ok.pt", _pt((torch.ones(4, 2), torch.arange(4)))),
        ("ok.jsonl", b'{"inputs": [1, 2], "label": 0}\n{"inputs": [3, 4], "label": 1}\n'),
        ("ok.csv", b"a,target\n1,0\n2,1\n"),
    ],
)
def test_each_format_the_engine_reads_is_still_accepted(
    owner: httpx.Client, name: str, body: bytes
) -> None:
    assert owner.post("/v1/datasets", files={"file": (name, body)}).status_code == 201
