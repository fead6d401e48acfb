"""Does a model take a dataset's batches? Checked at submission where both are known: the
model's ``forward`` signature read from its source at upload
(:mod:`ace3_server.upload_checks.model_forward`) and the dataset's batch layout recorded when it
was stored (:func:`batch_layout_of_format`).

The engine passes ``(inputs, targets)`` batches as ``model(inputs)`` and dict batches as
``model(**batch)`` (:mod:`ace3.runtime.loop.losses`); a model module with ``compute_loss``
records no signature, so it is never checked here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ace3.config import runs_pipeline

PAIR: dict[str, Any] = {"kind": "pair"}
"""The layout of every dataset the engine reads as a ``TensorDataset`` of (inputs, targets)."""
TOKEN_FIELDS = ("input_ids", "labels")


def dict_layout(keys: list[str] | tuple[str, ...]) -> dict[str, Any]:
    return {"kind": "dict", "keys": list(keys)}


def batch_layout_of_format(data_format: str) -> dict[str, Any] | None:
    """The layout of a sharded dataset's batches by its format; None where the shards decide
    (a WebDataset sample is keyed by its members' extensions)."""
    if data_format in ("parquet", "jsonl"):
        return PAIR
    if data_format == "tokens":
        return dict_layout(TOKEN_FIELDS)
    return None


def _render(signature: dict[str, Any]) -> str:
    """``Net.forward(self, x, /, mask=..., *args, scale, **kwargs)``."""

    def spelled(param: dict[str, Any]) -> str:
        return param["name"] + ("" if param["required"] else "=...")

    params = signature["params"]
    parts = ["self"]
    positional_only = [spelled(p) for p in params if p["kind"] == "positional_only"]
    if positional_only:
        parts += [*positional_only, "/"]
    parts += [spelled(p) for p in params if p["kind"] == "positional"]
    keyword_only = [spelled(p) for p in params if p["kind"] == "keyword_only"]
    if signature["var_positional"]:
        parts.append("*args")
    elif keyword_only:
        parts.append("*")
    parts += keyword_only
    if signature["var_keyword"]:
        parts.append("**kwargs")
    return f"{signature['method']}({', '.join(parts)})"


def _names(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)


def pair_problem(signature: dict[str, Any]) -> str | None:
    """Why ``model(inputs)`` cannot bind, or None."""
    params = signature["params"]
    positional = [p for p in params if p["kind"] != "keyword_only"]
    if positional:
        rest = [p for p in params if p is not positional[0]]
    elif signature["var_positional"]:
        rest = params
    else:
        return f"{_render(signature)} takes no positional argument"
    missing = [p["name"] for p in rest if p["required"]]
    if missing:
        return f"{_render(signature)} also requires {_names(missing)}"
    return None


def dict_problem(signature: dict[str, Any], keys: list[str]) -> str | None:
    """Why ``model(**batch)`` with these keys cannot bind, or None."""
    params = signature["params"]
    by_keyword = {p["name"] for p in params if p["kind"] != "positional_only"}
    unexpected = [] if signature["var_keyword"] else [k for k in keys if k not in by_keyword]
    missing = [
        p["name"]
        for p in params
        if p["required"] and (p["kind"] == "positional_only" or p["name"] not in keys)
    ]
    by_position = [p["name"] for p in params if p["required"] and p["kind"] == "positional_only"]
    missing = [name for name in missing if name not in by_position]
    reasons = []
    if unexpected:
        noun = "parameter" if len(unexpected) == 1 else "parameters"
        reasons.append(f"has no {noun} {_names(unexpected)}")
    if missing:
        reasons.append(f"requires {_names(missing)}, which the batches lack")
    if by_position:
        reasons.append(f"takes {_names(by_position)} only by position, which model(**batch) cannot")
    if not reasons:
        return None
    return f"{_render(signature)} " + " and ".join(reasons)


def batch_fit_problem(
    signature: dict[str, Any] | None, layout: dict[str, Any] | None, model_file: str
) -> str | None:
    """Why the model cannot take the dataset's batches, or None (also when either is unknown)."""
    if signature is None or layout is None or layout["kind"] not in ("pair", "dict"):
        return None
    hint = (
        f"; define compute_loss(model, batch) in {model_file} to feed the model yourself, or "
        "choose a dataset whose batches its forward takes"
    )
    if layout["kind"] == "pair":
        problem = pair_problem(signature)
        if problem is not None:
            return (
                "the dataset gives (inputs, targets) batches, which the engine passes as "
                f"model(inputs), but {problem}{hint}"
            )
        return None
    keys = list(layout["keys"])
    problem = dict_problem(signature, keys)
    if problem is not None:
        return (
            f"the dataset gives dict batches of {_names(keys)}, which the engine passes as "
            f"model(**batch), but {problem}{hint}"
        )
    return None


def records_problem(layout: dict[str, Any] | None, hf_config: dict[str, Any] | None) -> str | None:
    """Text records are tokenized with a Hugging Face model's own tokenizer (``hf_config``: its
    stored record; None for any other model); chat records need its chat template."""
    if layout is None or layout["kind"] != "records":
        return None
    if hf_config is None:
        return (
            f"the dataset holds {layout['records'].replace('_', '/')} text records, which are "
            "tokenized with a Hugging Face model's own tokenizer: train a Hugging Face model "
            "directory (client.load_model(dir)) on them, or give this model numbers"
        )
    if layout["records"] == "chat" and not hf_config.get("has_chat_template", True):
        return (
            "the dataset holds chat records, and the model directory's tokenizer has no chat "
            "template (chat_template.jinja, or chat_template in tokenizer_config.json) to "
            "render them with: add one to the directory, or give prompt/completion records"
        )
    if not hf_config.get("has_tokenizer", True):
        return "the dataset holds text records, and the model directory has no tokenizer"
    return None


def unread_shards(dataset: Any) -> bool:
    """jsonl shards whose records no one named: their records were never read (``PAIR`` is
    assumed), and a job on a Hugging Face model reads their kind from the first record (text
    records, or a clear failure)."""
    layout = getattr(dataset, "batch_layout", None)
    return (
        getattr(dataset, "kind", None) in ("remote", "shards")
        and getattr(dataset, "format", None) == "jsonl"
        and (layout is None or layout.get("kind") != "records")
    )


def huggingface_batch_problem(layout: dict[str, Any] | None) -> str | None:
    """A Hugging Face causal LM (a stored model directory) computes its loss only when given
    ``labels``, which (inputs, targets) batches, passed as ``model(inputs)``, never give it."""
    if layout is None or layout["kind"] != "pair":
        return None
    return (
        "the dataset gives (inputs, targets) batches, which the engine passes as model(inputs), "
        "but a Hugging Face model computes its loss only when given labels: train it on a "
        "dataset of dict batches with 'input_ids' and 'labels' (a tokens dataset, or a "
        "dataset.py whose samples are such dicts)"
    )


LAYOUT_FIELDS = frozenset({"parallelism", "pipeline_parallel_size"})
"""Fields that can make a run a pipeline (which feeds the model's stages, not its forward)."""


def searched(config: Any) -> set[str]:
    """The fields a search's ``search_space`` varies (none for a job's config)."""
    space = getattr(config, "search_space", None)
    return set(space) if isinstance(space, Mapping) else set()


def batch_problems(
    model: Any, datasets: Mapping[str, Any], config: Any, searched_fields: set[str]
) -> list[dict[str, Any]]:
    """Each dataset (``datasets``: the request field -> the owned row) whose batches the model
    (its stored row) cannot take, where both are known. Unchecked: a pipeline or layer-parallel
    run (it feeds the model's stages, not its forward), also when a search may make its trials
    one; a package (its other modules may change the model unseen)."""
    problems = packing_problems(datasets, config, model)
    if model is None or runs_pipeline(config) or searched_fields & LAYOUT_FIELDS:
        return problems
    for field, dataset in datasets.items():
        hf_config = (model.hf_config or {}) if model.kind == "huggingface" else None
        problem = records_problem(dataset.batch_layout, hf_config)
        if problem is None and model.kind == "huggingface" and not unread_shards(dataset):
            problem = huggingface_batch_problem(dataset.batch_layout)
        elif problem is None and model.kind == "file":
            problem = batch_fit_problem(
                model.forward_signature, dataset.batch_layout, model.filename
            )
        if problem is not None:
            msg = f"dataset {dataset.name!r} does not fit model {model.name!r}: {problem}"
            problems.append({"loc": ["body", field], "msg": msg, "type": "value_error"})
    return problems


def packing_problems(
    datasets: Mapping[str, Any], config: Any, model: Any = None
) -> list[dict[str, Any]]:
    """``packing`` packs text records; a training dataset known to hold something else is
    refused on ``config.packing``. jsonl shards whose records no one named may hold text
    records, which a Hugging Face model's job reads (``model`` None: not known yet); for any
    other model they are (inputs, targets) pairs, refused."""
    train = datasets.get("dataset_id")
    layout = getattr(train, "batch_layout", None)
    if not getattr(config, "packing", False) or layout is None or layout["kind"] == "records":
        return []
    if unread_shards(train) and getattr(model, "kind", "huggingface") == "huggingface":
        return []
    return [
        {
            "loc": ["body", "config", "packing"],
            "msg": "packing=True packs text records (chat, prompt/completion or text .jsonl) "
            "for a Hugging Face model directory; this dataset holds none: leave it off",
            "type": "value_error",
        }
    ]
