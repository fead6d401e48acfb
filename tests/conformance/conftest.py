"""Fixtures for the document conformance suite: the names the document's snippets assume.

``service``: the real stack (API + worker over Postgres, Redis, torchrun), with
``ACE3_API_KEY``/``ACE3_BASE_URL`` set so ``ace3.Client(...)`` and the default client reach it.
``remote_names``: ``client``, ``model`` (the conformance model file, uploaded) and ``dataset``
(scikit-learn digits, uploaded), as the document's Quick Start makes them.
``live_names``: a live ``model`` and torch ``dataset`` for the snippets that use a model's
parameters or call it directly. Every test runs in its own temporary directory (the snippets
write ``./logs``, ``./checkpoints``...).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ace3
from tests.conftest import DigitsFiles, Stack

ASSETS = Path(__file__).parent / "assets"
MODEL_FILE = ASSETS / "model.py"


@dataclass
class Service:
    stack: Stack
    api_key: str
    client: ace3.Client


@pytest.fixture(scope="session")
def service_key(stack: Stack) -> str:
    key, _ = stack.create_key("conformance")
    return key


@pytest.fixture
def service(
    stack: Stack, service_key: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Service]:
    monkeypatch.setenv("ACE3_API_KEY", service_key)
    monkeypatch.setenv("ACE3_BASE_URL", stack.base_url)
    monkeypatch.chdir(tmp_path)
    ace3.set_default_client(None)
    client = ace3.Client(api_key=service_key, base_url=stack.base_url)
    try:
        yield Service(stack, service_key, client)
    finally:
        client.close()
        ace3.set_default_client(None)


@pytest.fixture
def remote_names(service: Service, digits_files: DigitsFiles) -> dict[str, Any]:
    client = service.client
    return {
        "ace3": ace3,
        "client": client,
        "model": client.load_model(str(MODEL_FILE)),
        "dataset": client.load_dataset(str(digits_files.train)),
    }


def digits_arrays(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with np.load(path) as data:
        keys = sorted(data.files)
        inputs = data["inputs"] if "inputs" in keys else data[keys[0]]
        targets = data["targets"] if "targets" in keys else data[keys[1]]
        return inputs.astype(np.float32), targets.astype(np.int64)


@pytest.fixture
def live_names(digits_files: DigitsFiles, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import torch
    from torch.utils.data import TensorDataset

    monkeypatch.chdir(tmp_path)
    spec_globals: dict[str, Any] = {}
    exec(compile(MODEL_FILE.read_text(), str(MODEL_FILE), "exec"), spec_globals)
    torch.manual_seed(0)
    inputs, targets = digits_arrays(digits_files.train)
    dataset = TensorDataset(torch.from_numpy(inputs), torch.from_numpy(targets))
    return {
        "ace3": ace3,
        "torch": torch,
        "build_model": spec_globals["build_model"],
        "model": spec_globals["build_model"](),
        "dataset": dataset,
    }
