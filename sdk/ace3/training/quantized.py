"""The int8 model file a job with ``quantization`` writes, and :func:`load_quantized_model`.

The file is a safetensors file (plain tensors and a string header, never pickled code):

- for each quantized Linear ``name``: the fields of its torchao ``Int8Tensor`` weight as
  ``name.weight.qdata`` (int8, ``[out, in]``), ``name.weight.scale`` (one per output row),
  ``name.weight.zero_point`` and, for static quantization, ``name.weight.act_quant_scale``
  (the calibrated activation scale);
- every other entry of the model's state dict (biases, layers left in float) as it is;
- the metadata header: ``format`` (``ace3-int8``), ``version``, ``method`` (``dynamic`` or
  ``static``) and ``layers``, a JSON object giving each quantized layer's non-tensor settings
  (block size, dtype, how activations are quantized).

:func:`load_quantized_model` rebuilds the quantized layers on a freshly built float model of the
same architecture. Needs torchao (``pip install 'ace3[quantization]'``).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ace3.files import WrittenFile, write_atomic

FORMAT = "ace3-int8"
VERSION = "1"
INSTALL_HINT = "int8 quantization needs torchao: pip install 'ace3[quantization]'"
_TENSORS = ("qdata", "scale", "zero_point", "act_quant_scale", "act_quant_zero_point",
            "act_pre_scale")  # fmt: skip


def import_torchao() -> Any:
    """``torchao.quantization`` (the warnings its import logs about optional CUDA kernels and
    torch.compile registrations silenced), or an ImportError that says how to install it."""
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        import torchao.quantization as quantization
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
    return quantization


def _granularity_name(granularity: Any) -> str:
    return "per_tensor" if type(granularity).__name__ == "PerTensor" else "per_row"


def quantized_weights(model: nn.Module) -> dict[str, Any]:
    """Module name -> its int8 weight, for every module whose weight is a torchao Int8Tensor."""
    int8 = import_torchao().Int8Tensor
    return {
        name: module.weight
        for name, module in model.named_modules()
        if isinstance(getattr(module, "weight", None), int8)
    }


def _weight_key(module_name: str) -> str:
    """The state-dict key of a module's weight (the model itself may be the Linear layer)."""
    return f"{module_name}.weight" if module_name else "weight"


# The weight dtypes an int8 file may name (read from its header: never an arbitrary attribute).
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _dtype(name: object) -> torch.dtype:
    if not isinstance(name, str) or name not in _DTYPES:
        raise ValueError(f"an int8 model file names the unknown weight dtype {name!r}")
    return _DTYPES[name]


def save_quantized_model(model: nn.Module, path: Path, method: str) -> WrittenFile:
    """Write ``model`` (its Linear weights quantized with torchao) atomically as the format of
    the module docstring."""
    from safetensors.torch import save

    weights = quantized_weights(model)
    tensors: dict[str, torch.Tensor] = {}
    layers: dict[str, Any] = {}
    for name, weight in weights.items():
        present = [field for field in _TENSORS if getattr(weight, field, None) is not None]
        for field in present:
            tensors[f"{_weight_key(name)}.{field}"] = getattr(weight, field).detach().cpu().clone()
        kwargs = weight.act_quant_kwargs
        layers[name] = {
            "tensors": present,
            "block_size": list(weight.block_size),
            "dtype": str(weight.dtype).removeprefix("torch."),
            "reduce_range": bool(weight.reduce_range),
            "activation": None if kwargs is None else {
                "granularity": _granularity_name(kwargs.granularity),
                "mapping": kwargs.mapping_type.name,
                "reduce_range": bool(kwargs.reduce_range),
            },
        }  # fmt: skip
    skip = {_weight_key(name) for name in weights}
    for key, value in model.state_dict().items():
        if key not in skip:
            tensors[key] = value.detach().cpu().clone()
    header = {"format": FORMAT, "version": VERSION, "method": method, "layers": json.dumps(layers)}
    payload = save(tensors, metadata=header)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, lambda handle: handle.write(payload))


def _int8_weight(entry: dict[str, Any], data: dict[str, torch.Tensor]) -> Any:
    quantization = import_torchao()
    from torchao.quantization.granularity import PerRow, PerTensor
    from torchao.quantization.quant_primitives import MappingType
    from torchao.quantization.quantize_.workflows.int8.int8_tensor import (
        QuantizeTensorToInt8Kwargs,
    )

    act = entry["activation"]
    kwargs = None
    if act is not None:
        kwargs = QuantizeTensorToInt8Kwargs(
            granularity=PerTensor() if act["granularity"] == "per_tensor" else PerRow(),
            mapping_type=MappingType[act["mapping"]],
            reduce_range=bool(act["reduce_range"]),
        )
    return quantization.Int8Tensor(
        data["qdata"], data["scale"], list(entry["block_size"]), _dtype(entry["dtype"]),
        zero_point=data.get("zero_point"), act_quant_scale=data.get("act_quant_scale"),
        act_quant_zero_point=data.get("act_quant_zero_point"),
        act_pre_scale=data.get("act_pre_scale"), act_quant_kwargs=kwargs,
        reduce_range=bool(entry["reduce_range"]),
    )  # fmt: skip


def load_quantized_model(model: nn.Module, path: str | os.PathLike[str]) -> nn.Module:
    """Turn ``model`` (freshly built, float, same architecture as the trained one) into the int8
    model stored at ``path`` (``quantized/model-int8.safetensors`` of a job's artifacts), in
    place, on the CPU, in eval mode; return it. Reads plain tensors only: no pickled code."""
    from safetensors import safe_open

    with safe_open(os.fspath(path), framework="pt") as handle:
        header = handle.metadata() or {}
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise ValueError(
            f"{os.fspath(path)} is not an ACE3 int8 model file (format {header.get('format')!r}, "
            f"version {header.get('version')!r}; expected {FORMAT!r} version {VERSION})"
        )
    model.to("cpu")
    modules = dict(model.named_modules())
    for name, entry in json.loads(header["layers"]).items():
        module = modules.get(name)
        if not isinstance(module, nn.Linear):
            raise ValueError(f"{os.fspath(path)}: the model has no Linear layer {name!r}")
        fields = entry["tensors"]
        if (
            not isinstance(fields, list)
            or not set(fields) <= set(_TENSORS)
            or "qdata" not in fields
        ):
            raise ValueError(f"{os.fspath(path)}: layer {name!r} lists unknown tensors {fields!r}")
        missing = [f for f in fields if f"{_weight_key(name)}.{f}" not in tensors]
        if missing:
            raise ValueError(f"{os.fspath(path)}: layer {name!r} lacks its tensors {missing}")
        data = {field: tensors.pop(f"{_weight_key(name)}.{field}") for field in fields}
        if tuple(data["qdata"].shape) != tuple(module.weight.shape):
            raise ValueError(
                f"{os.fspath(path)}: layer {name!r} is {tuple(data['qdata'].shape)} in the file "
                f"and {tuple(module.weight.shape)} in the model: build the model with the "
                "arguments it was trained with"
            )
        module.weight = nn.Parameter(_int8_weight(entry, data), requires_grad=False)
    report = model.load_state_dict(tensors, strict=False)
    expected = {_weight_key(name) for name in json.loads(header["layers"])}
    wrong = [k for k in report.missing_keys if k not in expected] + list(report.unexpected_keys)
    if wrong:
        raise ValueError(
            f"{os.fspath(path)} does not fit the model: missing or unexpected entries {wrong[:10]}"
        )
    return model.eval()
