"""A carried callback's attribute values as JSON (non-finite floats marked), and the refusal
raised for what cannot be carried."""

from __future__ import annotations

import math
from typing import Any

from ace3.errors import UnsupportedFeatureError

__all__ = ["MOVE_HINT", "decode_value", "encode_value", "refuse"]

_FLOAT_MARK = "__ace3_float__"  # {"__ace3_float__": "inf"}: a non-finite float in JSON
MOVE_HINT = (
    "create it inside the callback (for example in on_train_begin), or define it in the "
    "callback's own file or the model file"
)


def refuse(message: str, field: str = "callbacks") -> UnsupportedFeatureError:
    return UnsupportedFeatureError(message, [{"field": field, "reason": message}])


# -- values -------------------------------------------------------------------------------------


def encode_value(value: Any, where: str) -> Any:
    """``value`` as JSON data (non-finite floats marked); refuses anything else, naming
    ``where``."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return {_FLOAT_MARK: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if isinstance(value, list | tuple):
        return [encode_value(item, f"{where}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        encoded = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise refuse(
                    f"{where} has the key {key!r}: only string keys can be sent to a training "
                    "job (JSON); use strings as keys"
                )
            encoded[key] = encode_value(item, f"{where}[{key!r}]")
        return encoded
    raise refuse(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__}, which cannot be sent "
        "to a training job: a callback's attributes must be JSON values (None, bool, int, "
        "float, str, and lists or dicts of those); " + MOVE_HINT
    )


def decode_value(value: Any) -> Any:
    """The inverse of :func:`encode_value` (tuples come back as lists)."""
    if isinstance(value, list):
        return [decode_value(item) for item in value]
    if isinstance(value, dict):
        if set(value) == {_FLOAT_MARK}:
            return float(value[_FLOAT_MARK])
        return {key: decode_value(item) for key, item in value.items()}
    return value
