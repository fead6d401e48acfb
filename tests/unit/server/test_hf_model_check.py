"""Hugging Face model directories checked at upload without torch (ace3_control.hf_model_dir):
what is read from config.json and the safetensors headers of real save_pretrained output
(single file and sharded), and every refusal with its message, on files built by hand."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from ace3_control.hf_model_dir import (
    MAX_CONFIG_ITEMS,
    MAX_JSON_ITEMS,
    MAX_MODEL_TENSORS,
    MAX_MODULE_NAMES,
    check_hf_model,
    is_hf_model_dir,
)
from ace3_server.upload_checks import UploadCheckError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

GPT2_CONFIG = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_positions": 32}


def _safetensors(tensors: dict[str, tuple[str, list[int]]], **header_extra: Any) -> bytes:
    """A safetensors file holding zero-filled tensors (dtype, shape) in the given order."""
    sizes = {"F32": 4, "F16": 2, "I64": 8}
    header: dict[str, Any] = dict(header_extra)
    offset = 0
    for name, (dtype, shape) in tensors.items():
        count = 1
        for size in shape:
            count *= size
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [offset, offset + count * sizes[dtype]],
        }
        offset += count * sizes[dtype]
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def _tree(tmp_path: Path, files: dict[str, bytes | dict[str, Any]]) -> Path:
    for name, content in files.items():
        data = json.dumps(content).encode() if isinstance(content, dict) else content
        (tmp_path / name).write_bytes(data)
    return tmp_path


WEIGHTS = _safetensors(
    {"a.weight": ("F32", [2, 3]), "a.bias": ("F32", [3]), "b.c.weight": ("F16", [4])}
)


@pytest.fixture(scope="module")
def gpt2() -> Any:
    config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config)


@pytest.mark.parametrize("shard_size", [None, "20KB"])
def test_a_saved_gpt2_is_described(gpt2: Any, tmp_path: Path, shard_size: str | None) -> None:
    extra = {} if shard_size is None else {"max_shard_size": shard_size}
    gpt2.save_pretrained(tmp_path, safe_serialization=True, **extra)
    if shard_size is not None:
        assert (tmp_path / "model.safetensors.index.json").is_file()
        assert not (tmp_path / "model.safetensors").exists()
    assert is_hf_model_dir(tmp_path)
    model = check_hf_model(tmp_path)
    assert model.architectures == ["GPT2LMHeadModel"]
    assert model.model_type == "gpt2"
    assert model.max_position_embeddings is None  # GPT-2 calls it n_positions
    # the tied lm_head is saved once: torch's parameters() counts it once too
    assert model.parameter_count == sum(p.numel() for p in gpt2.parameters())
    assert model.module_names is not None
    assert "transformer.h.0.attn.c_attn" in model.module_names
    assert "transformer.wte" in model.module_names
    assert model.module_names == sorted(set(model.module_names))
    assert not model.has_tokenizer and not model.has_chat_template


def test_config_and_tokenizer_fields(tmp_path: Path) -> None:
    config = {"model_type": "llama", "max_position_embeddings": 4096}
    files: dict[str, bytes | dict[str, Any]] = {"config.json": config, "model.safetensors": WEIGHTS}
    model = check_hf_model(_tree(tmp_path, files | {"tokenizer.json": {}}))
    assert (model.architectures, model.max_position_embeddings) == (None, 4096)
    assert model.parameter_count == 6 + 3 + 4
    assert model.module_names == ["a", "b.c"]
    assert model.has_tokenizer and not model.has_chat_template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert check_hf_model(tmp_path).summary() == {
        "model_type": "llama",
        "max_position_embeddings": 4096,
        "has_tokenizer": True,
        "has_chat_template": True,
    }
    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert not check_hf_model(tmp_path).has_chat_template
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert check_hf_model(tmp_path).has_chat_template


def test_pickled_weights_next_to_safetensors_are_accepted(tmp_path: Path) -> None:
    files: dict[str, bytes | dict[str, Any]] = {
        "config.json": GPT2_CONFIG,
        "pytorch_model.bin": b"",
    }
    files["model.safetensors"] = WEIGHTS
    assert check_hf_model(_tree(tmp_path, files)).parameter_count == 13


def _refusal(tmp_path: Path, files: dict[str, bytes | dict[str, Any]]) -> str:
    with pytest.raises(UploadCheckError) as caught:
        check_hf_model(_tree(tmp_path, files))
    return str(caught.value)


def test_pickled_weights_alone_are_refused_with_the_conversion_hint(tmp_path: Path) -> None:
    message = _refusal(
        tmp_path, {"config.json": GPT2_CONFIG, "training_args.bin": b"x", "pytorch_model.bin": b"x"}
    )
    assert message.startswith("pytorch_model.bin: pickled weights are refused")
    assert (
        "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        in message
    )
    assert _refusal(tmp_path, {"pytorch_model.bin": b"", "weights.pth": b""}).startswith(
        "pytorch_model.bin: pickled"
    )


def test_no_weights_is_refused(tmp_path: Path) -> None:
    message = _refusal(tmp_path, {"config.json": GPT2_CONFIG, "other.safetensors": WEIGHTS})
    assert message.startswith(
        "no weights: expected model.safetensors, or model.safetensors.index.json"
    )


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (b"{not json", "config.json: not valid JSON"),
        (b"[1]", "config.json: expected a JSON object"),
        (b"{}", "config.json: needs a string model_type"),
        (json.dumps({"model_type": 3}).encode(), "config.json: needs a string model_type"),
        (
            json.dumps({"model_type": "gpt2", "architectures": "GPT2"}).encode(),
            "config.json: architectures must be a list of class names",
        ),
        (b" " * (4 * 1024 * 1024 + 1), "config.json: larger than 4 MB"),
    ],
)
def test_a_bad_config_is_refused(tmp_path: Path, config: bytes, expected: str) -> None:
    assert _refusal(tmp_path, {"config.json": config, "model.safetensors": WEIGHTS}).startswith(
        expected
    )


@pytest.mark.parametrize(
    ("weights", "expected"),
    [
        (b"\x01\x02", "too short for a safetensors file"),
        (WEIGHTS[:-1], "data_offsets must be [begin, end] within the data"),
        (struct.pack("<Q", 10**9) + b"{}", "not a safetensors file (bad header length)"),
        (struct.pack("<Q", 5) + b"{abc}", "not a safetensors file (its header is not JSON)"),
        (struct.pack("<Q", 2) + b"[]", "not a safetensors file (its header is not an object)"),
        (
            _safetensors({"w": ("F32", [2])}, __metadata__={"format": "pt"}) + b"xx",
            "the tensors take 8 bytes but the file holds 10",
        ),
    ],
)
def test_a_corrupt_or_truncated_header_is_refused(
    tmp_path: Path, weights: bytes, expected: str
) -> None:
    message = _refusal(tmp_path, {"config.json": GPT2_CONFIG, "model.safetensors": weights})
    assert message.startswith("model.safetensors: ") and expected in message, message


def _raw_header(header: dict[str, Any], data: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(data)


@pytest.mark.parametrize(
    ("header", "data", "expected"),
    [
        ({"w": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 4]}}, 4, "unknown dtype 'Q9'"),
        (
            {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
            4,
            "4 bytes for its shape of F32 (expected more than the file holds)",
        ),
        (
            {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 8]}},
            4,
            "data_offsets must be [begin, end] within the data",
        ),
        ({"w": {"dtype": "F32", "shape": [1]}}, 4, "expected dtype, shape and data_offsets"),
        (
            {
                "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "v": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            },
            4,
            "overlap or leave gaps",
        ),
        ({"__metadata__": {"format": "pt"}}, 0, "the file holds no tensor"),
        (
            {"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}},
            0,
            "shape must be a list of at most 64 sizes >= 0",
        ),
    ],
)
def test_inconsistent_entries_are_refused(
    tmp_path: Path, header: dict[str, Any], data: int, expected: str
) -> None:
    weights = _raw_header(header, data)
    message = _refusal(tmp_path, {"config.json": GPT2_CONFIG, "model.safetensors": weights})
    assert message.startswith("model.safetensors: ") and expected in message, message


def _sharded(
    weight_map: dict[str, Any], shards: dict[str, bytes]
) -> dict[str, bytes | dict[str, Any]]:
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    return {"config.json": GPT2_CONFIG, "model.safetensors.index.json": index, **shards}


def test_shards_are_checked_against_the_index(tmp_path: Path) -> None:
    one = _safetensors({"a.weight": ("F32", [2])})
    two = _safetensors({"b.weight": ("F32", [3]), "b.bias": ("F32", [3])})
    good = _sharded(
        {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors", "b.bias": "s2.safetensors"},
        {"s1.safetensors": one, "s2.safetensors": two},
    )
    model = check_hf_model(_tree(tmp_path, good))
    assert (model.parameter_count, model.module_names) == (8, ["a", "b"])


@pytest.mark.parametrize(
    ("weight_map", "shards", "expected"),
    [
        (
            {"a.weight": "missing.safetensors"},
            {},
            "model.safetensors.index.json: names the shard 'missing.safetensors', which is missing",
        ),
        (
            {"a.weight": "../s1.safetensors"},
            {},
            "model.safetensors.index.json: tensor 'a.weight' names",
        ),
        (
            {"a.weight": "sub/s1.safetensors"},
            {},
            "model.safetensors.index.json: tensor 'a.weight' names",
        ),
        ({"a.weight": 3}, {}, "model.safetensors.index.json: tensor 'a.weight' names"),
        ({}, {}, "model.safetensors.index.json: weight_map must map tensor names to shard files"),
        (
            {"a.weight": "s1.safetensors", "zzz": "s1.safetensors"},
            {"s1.safetensors": "one"},
            "s1.safetensors: model.safetensors.index.json puts 'zzz' in it, but it does not hold it",
        ),
        (
            {"a.weight": "s1.safetensors", "b": "s2.safetensors"},
            {"s1.safetensors": "one", "s2.safetensors": "one"},
            "s2.safetensors: holds 'a.weight', but model.safetensors.index.json puts it in "
            "s1.safetensors",
        ),
        (
            {"a.weight": "s1.safetensors"},
            {"s1.safetensors": "bad"},
            "s1.safetensors: too short for a safetensors file",
        ),
    ],
)
def test_bad_shards_are_refused(
    tmp_path: Path, weight_map: dict[str, Any], shards: dict[str, str], expected: str
) -> None:
    contents = {"one": _safetensors({"a.weight": ("F32", [2])}), "bad": b"x"}
    files = _sharded(weight_map, {name: contents[kind] for name, kind in shards.items()})
    assert _refusal(tmp_path, files).startswith(expected)


# A review's reproducer: header-only shards tiled with zero-byte tensors the index never names,
# or an index naming more tensors than any model has, made the API build millions of module
# names (+567 MB, 19 s for 118 MB of shards). Each is now refused before it costs anything.


def _empty_tensors(count: int, name: str = "m{}.w") -> dict[str, tuple[str, list[int]]]:
    return {name.format(i): ("F32", [0]) for i in range(count)}


def test_a_shard_holding_tensors_the_index_does_not_name_is_refused(tmp_path: Path) -> None:
    one_more = _safetensors({"a.weight": ("F32", [2]), "x.weight": ("F32", [0])})
    files = _sharded({"a.weight": "s1.safetensors"}, {"s1.safetensors": one_more})
    assert _refusal(tmp_path, files) == (
        "s1.safetensors: more than 1 tensors (model.safetensors.index.json puts 1 in it)"
    )
    other = _safetensors({"x.weight": ("F32", [2])})
    files = _sharded({"a.weight": "s1.safetensors"}, {"s1.safetensors": other})
    assert _refusal(tmp_path, files) == (
        "s1.safetensors: holds 'x.weight', but model.safetensors.index.json does not name it "
        "(1 such tensor(s))"
    )
    tiled = _safetensors({"a.weight": ("F32", [2])} | _empty_tensors(150_000))
    files = _sharded({"a.weight": "s1.safetensors"}, {"s1.safetensors": tiled})
    assert _refusal(tmp_path, files) == (
        "s1.safetensors: more than 1 tensors' worth of header "
        "(model.safetensors.index.json puts 1 in it)"
    )


def test_a_model_holds_at_most_max_model_tensors(tmp_path: Path) -> None:
    count = MAX_MODEL_TENSORS + 1
    names = [f"m{i}.w" for i in range(count)]
    shards = {"s1.safetensors": names[: count // 2], "s2.safetensors": names[count // 2 :]}
    files = _sharded(
        {name: shard for shard, held in shards.items() for name in held},
        {shard: _safetensors({n: ("F32", [0]) for n in held}) for shard, held in shards.items()},
    )
    assert _refusal(tmp_path, files) == (
        f"model.safetensors.index.json: names {count} tensors, more than the "
        f"{MAX_MODEL_TENSORS} a model may hold"
    )
    single: dict[str, bytes | dict[str, Any]] = {
        "config.json": GPT2_CONFIG,
        "model.safetensors": _safetensors(_empty_tensors(count)),
    }
    (tmp_path / "single").mkdir()
    assert _refusal(tmp_path / "single", single).startswith(
        f"model.safetensors: more than {MAX_MODEL_TENSORS} tensors"
    )


def test_too_many_module_names_are_not_recorded(tmp_path: Path) -> None:
    count = MAX_MODULE_NAMES + 1
    files: dict[str, bytes | dict[str, Any]] = {
        "config.json": GPT2_CONFIG,
        "model.safetensors": _safetensors({"w.weight": ("F32", [2])} | _empty_tensors(count - 1)),
    }
    model = check_hf_model(_tree(tmp_path, files))
    assert model.module_names is None and model.parameter_count == 2
    assert model.summary()["module_names_omitted"] == count
    files["model.safetensors"] = _safetensors(_empty_tensors(MAX_MODULE_NAMES))
    model = check_hf_model(_tree(tmp_path, files))
    assert model.module_names is not None and len(model.module_names) == MAX_MODULE_NAMES
    assert "module_names_omitted" not in model.summary()
    long_names = _empty_tensors(2000, "m{}" + "x" * 600 + ".w")  # 1.2 MB of names in all
    files["model.safetensors"] = _safetensors(long_names)
    assert check_hf_model(_tree(tmp_path, files)).module_names is None


def _list_of_lists(count: int) -> bytes:
    return b"[" + b"[]," * count + b"[]]"


@pytest.mark.parametrize(
    ("name", "limit"),
    [
        ("config.json", MAX_CONFIG_ITEMS),
        ("tokenizer_config.json", MAX_JSON_ITEMS),
        ("model.safetensors.index.json", MAX_JSON_ITEMS),
    ],
)
def test_json_of_too_many_values_is_refused_before_parsing(
    tmp_path: Path, name: str, limit: int
) -> None:
    # (a 32 MB [[],[],...] costs the parser ~685 MB)
    files: dict[str, bytes | dict[str, Any]] = {
        "config.json": GPT2_CONFIG,
        "model.safetensors": WEIGHTS,
        name: b'{"weight_map": {"a": "s1.safetensors"}, "x": ' + _list_of_lists(limit) + b"}",
    }
    if name == "model.safetensors.index.json":
        del files["model.safetensors"]
    assert _refusal(tmp_path, files) == f"{name}: more than {limit} JSON values"
    # strings do not count: commas and brackets in them are text
    files[name] = {"model_type": "gpt2", "weight_map": {"a.weight": "s1.safetensors"}} | {
        "x": "[],{" * limit
    }
    files["s1.safetensors"] = _safetensors({"a.weight": ("F32", [2])})
    check_hf_model(_tree(tmp_path, files))


def test_a_header_of_too_many_values_is_refused_before_parsing(tmp_path: Path) -> None:
    entry = json.dumps({"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}).encode()

    def weights(items: int) -> bytes:
        raw = b'{"w": ' + entry + b', "x": ' + _list_of_lists(items) + b"}"
        return struct.pack("<Q", len(raw)) + raw + bytes(4)

    # 16 values a tensor, and 1024 more: 1.6M for a whole model in one file
    single: dict[str, bytes | dict[str, Any]] = {
        "config.json": GPT2_CONFIG,
        "model.safetensors": weights(16 * MAX_MODEL_TENSORS),
    }
    assert _refusal(tmp_path, single) == (
        f"model.safetensors: more than {MAX_MODEL_TENSORS} tensors' worth of header"
    )
    # a shard is allowed what the index puts in it
    files = _sharded({"w": "s1.safetensors"}, {"s1.safetensors": weights(1000)})
    (tmp_path / "sharded").mkdir()
    assert _refusal(tmp_path / "sharded", files) == (
        "s1.safetensors: more than 1 tensors' worth of header "
        "(model.safetensors.index.json puts 1 in it)"
    )
