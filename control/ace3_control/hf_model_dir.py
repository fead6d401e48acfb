"""A Hugging Face model directory (what ``save_pretrained`` writes), checked and described
without torch or transformers, at upload (the API) and when a job's export is registered as a
model (the worker, ``ace3_worker.export_registration``): neither ever builds the model (only a
job's sandbox does, with ``from_pretrained``), so everything here is read from ``config.json``
and the safetensors headers.

Accepted: a top-level ``config.json`` (a JSON object with a string ``model_type``) and
safetensors weights, ``model.safetensors`` or ``model.safetensors.index.json`` with its shards
(``from_pretrained``'s order: the single file first). Pickled weights alone are refused with the
conversion hint (unpickling them runs code); next to safetensors they are kept but never loaded.
Tokenizer files, ``generation_config.json`` and ``chat_template.jinja`` travel with the tree.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ace3_control.check_errors import UploadCheckError
from ace3_control.safetensors_headers import json_item_count, read_safetensors_shapes

# How a model directory is stored (an upload's or a job's export): kind "huggingface", built with
# from_pretrained, no entry module; under models/<owner>/<sha256>-<variant digest>/tree.
HUGGINGFACE = "huggingface"
FROM_PRETRAINED = "from_pretrained"
VARIANT = f"{FROM_PRETRAINED}|"
CONFIG = "config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE = "chat_template.jinja"
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_INDEX_BYTES = 32 * 1024 * 1024
MAX_TOKENIZER_CONFIG_BYTES = 32 * 1024 * 1024
# JSON items (commas and containers outside strings, json_item_count) before parsing: a real
# config.json holds hundreds (an id2label of 22k classes, 50k); an index about one per tensor; a
# tokenizer_config.json with 100k added tokens, 700k. Past them parsing would cost the API
# hundreds of MB.
MAX_CONFIG_ITEMS = 100_000
MAX_JSON_ITEMS = 1_000_000
# Tensors in all of a model's weights: Llama-3-70B has 723, Mixtral-8x7B 995, DeepSeek-V3 (fp8,
# with its scales) about 92k. Every tensor costs the API a header entry and a module name.
MAX_MODEL_TENSORS = 100_000
# module_names the record keeps (the LoRA check at submission reads them): a model with more, or
# with longer names in all, records none (null; its hf_config says how many it has) and its
# LoRA targets are checked by the job's build alone. Llama-3-70B has 561, Mixtral-8x7B 675.
MAX_MODULE_NAMES = 20_000
MAX_MODULE_NAME_CHARS = 1_000_000
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
    module_names: list[str] | None  # None: more than the record keeps
    has_tokenizer: bool
    has_chat_template: bool
    module_count: int

    def summary(self) -> dict[str, Any]:
        """The small ``hf_config`` JSON the record keeps (``module_names_omitted``, the number
        of modules, only where there were too many to record)."""
        omitted = (
            {} if self.module_names is not None else {"module_names_omitted": self.module_count}
        )
        return {
            "model_type": self.model_type,
            "max_position_embeddings": self.max_position_embeddings,
            "has_tokenizer": self.has_tokenizer,
            "has_chat_template": self.has_chat_template,
        } | omitted


class _Weights:
    """The parameter count and module names of the tensors read so far, one file at a time (the
    headers' shapes are not kept: memory stays bounded by the tensor cap)."""

    def __init__(self) -> None:
        self.parameter_count = 0
        self.module_names: set[str] = set()
        self.name_chars = 0

    def add(self, shapes: dict[str, list[int]]) -> None:
        for name, shape in shapes.items():
            self.parameter_count += math.prod(shape)
            module = name.rpartition(".")[0]
            if module and module not in self.module_names:
                self.module_names.add(module)
                self.name_chars += len(module)

    def recorded_names(self) -> list[str] | None:
        if len(self.module_names) > MAX_MODULE_NAMES or self.name_chars > MAX_MODULE_NAME_CHARS:
            return None
        return sorted(self.module_names)


def is_hf_model_dir(tree: Path) -> bool:
    """Whether ``tree`` looks like a Hugging Face model directory (a top-level config.json)."""
    return _plain_file(tree / CONFIG)


def check_hf_model(tree: Path) -> HuggingFaceModel:
    """The description of the model directory ``tree``; UploadCheckError naming the file and
    what is wrong with it otherwise."""
    config = _read_json_object(tree / CONFIG, MAX_CONFIG_BYTES, MAX_CONFIG_ITEMS)
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
    weights = _weights(tree)
    return HuggingFaceModel(
        model_type=model_type,
        architectures=architectures,
        max_position_embeddings=positions,
        parameter_count=weights.parameter_count,
        module_names=weights.recorded_names(),
        has_tokenizer=_plain_file(tree / "tokenizer.json") or _plain_file(tree / TOKENIZER_CONFIG),
        has_chat_template=_has_chat_template(tree),
        module_count=len(weights.module_names),
    )


def _plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _read_json_object(path: Path, max_bytes: int, max_items: int) -> dict[str, Any]:
    name = path.name
    if path.stat().st_size > max_bytes:
        raise UploadCheckError(f"{name}: larger than {max_bytes // (1024 * 1024)} MB")
    raw = path.read_bytes()
    if json_item_count(raw) > max_items:  # before parsing: bounded memory
        raise UploadCheckError(f"{name}: more than {max_items} JSON values")
    try:
        value = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # (JSONDecodeError, UnicodeDecodeError)
        raise UploadCheckError(f"{name}: not valid JSON") from None
    if not isinstance(value, dict):
        raise UploadCheckError(f"{name}: expected a JSON object")
    return value


def _weights(tree: Path) -> _Weights:
    """What the safetensors weights ``from_pretrained`` loads hold, at most
    ``MAX_MODEL_TENSORS`` tensors in all."""
    weights = _Weights()
    if _plain_file(tree / SINGLE_WEIGHTS):
        weights.add(_shapes_of(tree / SINGLE_WEIGHTS, MAX_MODEL_TENSORS))
        return weights
    if _plain_file(tree / WEIGHTS_INDEX):
        _add_shards(tree, weights)
        return weights
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


def _shapes_of(path: Path, max_tensors: int, why: str = "") -> dict[str, list[int]]:
    try:
        return read_safetensors_shapes(path, max_tensors)
    except UploadCheckError as exc:
        raise UploadCheckError(f"{path.name}: {exc}{why}") from None


def _add_shards(tree: Path, weights: _Weights) -> None:
    """Each shard's tensors, exactly those the index puts in it (so the index bounds the work:
    a shard cannot hold tensors it never names)."""
    index = _read_json_object(tree / WEIGHTS_INDEX, MAX_INDEX_BYTES, MAX_JSON_ITEMS)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise UploadCheckError(f"{WEIGHTS_INDEX}: weight_map must map tensor names to shard files")
    if len(weight_map) > MAX_MODEL_TENSORS:
        raise UploadCheckError(
            f"{WEIGHTS_INDEX}: names {len(weight_map)} tensors, more than the "
            f"{MAX_MODEL_TENSORS} a model may hold"
        )
    shards: dict[str, set[str]] = {}
    for tensor, shard in weight_map.items():
        if not isinstance(shard, str) or shard in ("", ".", "..") or "/" in shard or "\\" in shard:
            raise UploadCheckError(
                f"{WEIGHTS_INDEX}: tensor {tensor[:200]!r} names {str(shard)[:200]!r}, not a "
                "file name next to the index"
            )
        shards.setdefault(shard, set()).add(tensor)
    for shard in sorted(shards):
        if not _plain_file(tree / shard):
            raise UploadCheckError(f"{WEIGHTS_INDEX}: names the shard {shard!r}, which is missing")
        named = shards[shard]
        shard_shapes = _shapes_of(
            tree / shard, len(named), f" ({WEIGHTS_INDEX} puts {len(named)} in it)"
        )
        unnamed = sorted(set(shard_shapes) - named)
        if unnamed:
            placed = weight_map.get(unnamed[0])
            where = f"puts it in {placed}" if placed is not None else "does not name it"
            raise UploadCheckError(
                f"{shard}: holds {unnamed[0][:200]!r}, but {WEIGHTS_INDEX} {where} "
                f"({len(unnamed)} such tensor(s))"
            )
        missing = sorted(named - set(shard_shapes))
        if missing:
            raise UploadCheckError(
                f"{shard}: {WEIGHTS_INDEX} puts {missing[0][:200]!r} in it, but it does not "
                f"hold it ({len(missing)} such tensor(s))"
            )
        weights.add(shard_shapes)


def _has_chat_template(tree: Path) -> bool:
    if _plain_file(tree / CHAT_TEMPLATE):
        return True
    if not _plain_file(tree / TOKENIZER_CONFIG):
        return False
    tokenizer_config = _read_json_object(
        tree / TOKENIZER_CONFIG, MAX_TOKENIZER_CONFIG_BYTES, MAX_JSON_ITEMS
    )
    return bool(tokenizer_config.get("chat_template"))


def stored_tree_key(owner_id: str, sha256: str) -> str:
    """The store key of an owner's model directory whose record's sha256 is ``sha256``."""
    variant_digest = hashlib.sha256(VARIANT.encode()).hexdigest()[:16]
    return f"models/{owner_id}/{sha256}-{variant_digest}/tree"
