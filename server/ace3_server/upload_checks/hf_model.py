"""A Hugging Face model directory (what ``save_pretrained`` writes), checked and described at
upload without torch or transformers: the server never builds the model (only the job's sandbox
does, with ``from_pretrained``), so everything here is read from ``config.json`` and the
safetensors headers.

Accepted: a top-level ``config.json`` (a JSON object with a string ``model_type``) and
safetensors weights, ``model.safetensors`` or ``model.safetensors.index.json`` with its shards
(``from_pretrained``'s order: the single file first). Pickled weights alone are refused with the
conversion hint (unpickling them runs code); next to safetensors they are kept but never loaded.
Tokenizer files, ``generation_config.json`` and ``chat_template.jinja`` travel with the tree.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ace3_server.upload_checks.errors import UploadCheckError
from ace3_server.upload_checks.safetensors import read_safetensors_shapes

CONFIG = "config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_INDEX_BYTES = 32 * 1024 * 1024
MAX_TOKENIZER_CONFIG_BYTES = 32 * 1024 * 1024
PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
CONVERSION_HINT = (
    "convert it where you trust the file: AutoModelForCausalLM.from_pretrained(dir)"
    ".save_pretrained(dir, safe_serialization=True)"
)


@dataclass(frozen=True)
class HuggingFaceModel:
    """What the record shows of an accepted directory."""

    model_type: str
    architectures: list[str] | None
    max_position_embeddings: int | None
    parameter_count: int
    module_names: list[str]
    has_tokenizer: bool
    has_chat_template: bool

    def summary(self) -> dict[str, Any]:
        """The small ``hf_config`` JSON the record keeps."""
        return {
            "model_type": self.model_type,
            "max_position_embeddings": self.max_position_embeddings,
            "has_tokenizer": self.has_tokenizer,
            "has_chat_template": self.has_chat_template,
        }


def is_hf_model_dir(tree: Path) -> bool:
    """Whether ``tree`` looks like a Hugging Face model directory (a top-level config.json)."""
    return _plain_file(tree / CONFIG)


def check_hf_model(tree: Path) -> HuggingFaceModel:
    """The description of the model directory ``tree``; UploadCheckError naming the file and
    what is wrong with it otherwise."""
    config = _read_json_object(tree / CONFIG, MAX_CONFIG_BYTES)
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UploadCheckError(
            f'{CONFIG}: needs a string model_type (what AutoConfig builds), e.g. "gpt2"'
        )
    architectures = config.get("architectures")
    if architectures is not None and not (
        isinstance(architectures, list) and all(isinstance(a, str) for a in architectures)
    ):
        raise UploadCheckError(f"{CONFIG}: architectures must be a list of class names")
    positions = config.get("max_position_embeddings")
    if not isinstance(positions, int) or isinstance(positions, bool) or positions < 1:
        positions = None
    shapes = _weights_shapes(tree)
    return HuggingFaceModel(
        model_type=model_type,
        architectures=architectures,
        max_position_embeddings=positions,
        parameter_count=sum(math.prod(shape) for shape in shapes.values()),
        module_names=sorted({name.rpartition(".")[0] for name in shapes} - {""}),
        has_tokenizer=_plain_file(tree / "tokenizer.json") or _plain_file(tree / TOKENIZER_CONFIG),
        has_chat_template=_has_chat_template(tree),
    )


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _read_json_object(path: Path, max_bytes: int) -> dict[str, Any]:
    name = path.name
    if path.stat().st_size > max_bytes:
        raise UploadCheckError(f"{name}: larger than {max_bytes // (1024 * 1024)} MB")
    try:
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError):  # (JSONDecodeError, UnicodeDecodeError)
        raise UploadCheckError(f"{name}: not valid JSON") from None
    if not isinstance(value, dict):
        raise UploadCheckError(f"{name}: expected a JSON object")
    return value


def _weights_shapes(tree: Path) -> dict[str, list[int]]:
    """Every tensor's shape by name, from the safetensors weights ``from_pretrained`` loads."""
    if _plain_file(tree / SINGLE_WEIGHTS):
        return _shapes_of(tree / SINGLE_WEIGHTS)
    if _plain_file(tree / WEIGHTS_INDEX):
        return _sharded_shapes(tree)
    pickled = sorted(
        (p.name for p in tree.iterdir() if _plain_file(p) and p.name.endswith(PICKLED_SUFFIXES)),
        key=lambda name: (not name.startswith("pytorch_model"), name),
    )
    if pickled:
        raise UploadCheckError(
            f"{pickled[0]}: pickled weights are refused (loading them runs code); "
            f"upload safetensors weights instead: {CONVERSION_HINT}"
        )
    raise UploadCheckError(
        f"no weights: expected {SINGLE_WEIGHTS}, or {WEIGHTS_INDEX} and its shards, next to "
        f"{CONFIG} (save_pretrained(dir, safe_serialization=True) writes them)"
    )


def _shapes_of(path: Path) -> dict[str, list[int]]:
    try:
        return read_safetensors_shapes(path)
    except UploadCheckError as exc:
        raise UploadCheckError(f"{path.name}: {exc}") from None


def _sharded_shapes(tree: Path) -> dict[str, list[int]]:
    index = _read_json_object(tree / WEIGHTS_INDEX, MAX_INDEX_BYTES)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UploadCheckError(f"{WEIGHTS_INDEX}: weight_map must map tensor names to shard files")
    shards: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or shard in ("", ".", "..") or "/" in shard or "\\" in shard:
            raise UploadCheckError(
                f"{WEIGHTS_INDEX}: tensor {tensor[:200]!r} names {str(shard)[:200]!r}, not a "
                "file name next to the index"
            )
        shards.setdefault(shard, set()).add(tensor)
    shapes: dict[str, list[int]] = {}
    found_in: dict[str, str] = {}
    for shard in sorted(shards):
        if not _plain_file(tree / shard):
            raise UploadCheckError(f"{WEIGHTS_INDEX}: names the shard {shard!r}, which is missing")
        shard_shapes = _shapes_of(tree / shard)
        for tensor, shape in shard_shapes.items():
            if tensor in found_in:
                raise UploadCheckError(
                    f"{shard}: tensor {tensor[:200]!r} is also in {found_in[tensor]}"
                )
            found_in[tensor] = shard
            shapes[tensor] = shape
        missing = sorted(shards[shard] - set(shard_shapes))
        if missing:
            raise UploadCheckError(
                f"{shard}: {WEIGHTS_INDEX} puts {missing[0][:200]!r} in it, but it does not "
                f"hold it ({len(missing)} such tensor(s))"
            )
    return shapes


def _has_chat_template(tree: Path) -> bool:
    if _plain_file(tree / CHAT_TEMPLATE):
        return True
    if not _plain_file(tree / TOKENIZER_CONFIG):
        return False
    tokenizer_config = _read_json_object(tree / TOKENIZER_CONFIG, MAX_TOKENIZER_CONFIG_BYTES)
    return bool(tokenizer_config.get("chat_template"))
