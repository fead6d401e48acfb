"""YAML job and search files with Hydra-style ``key=value`` overrides, merged with OmegaConf and
validated into the SDK's own objects (:class:`~ace3.TrainingConfig`, :class:`~ace3.HPConfig`).

A job file::

    name: digits-mlp                    # optional
    model: model.py                     # or {path, factory, entry_module, kwargs}
    dataset: data/train.npz             # or {id: <dataset id>}: one the service stores
    validation_dataset: data/val.npz    # optional; a path or {id: ...} too
    requirements: [einops>=0.8]         # optional: training.requirements, the packages the
                                        # job adds to the worker's Python (PEP 508 names)
    training:                           # TrainingConfig fields
      epochs: 3
      learning_rate: 3.0e-3

``dataset: {id: <dataset id>}`` names a dataset the service already stores (uploaded before,
or registered from a bucket with ``ace3 datasets register``; ``ace3 datasets list`` shows the
ids) instead of a local path to upload; ``dataset.id=<id>`` as an override.

A search file is a job file plus ``search:`` (the fields of :class:`~ace3.HPConfig` but
``base_config``, which is ``training:``)::

    search:
      objective: val_accuracy
      direction: maximize
      algorithm: random
      max_trials: 8
      search_space:
        learning_rate: {type: loguniform, low: 1.0e-4, high: 1.0e-2}
        model.hidden: {type: choice, options: [32, 64]}

Relative paths in the file resolve against the file's directory; paths given as overrides
resolve against the current directory. A value may refer to another key (``${training.epochs}``)
but may not call a resolver (``${oc.env:AWS_SECRET_ACCESS_KEY}``, ``${oc.decode:...}``, any
``${name:...}``) or nest interpolations: a shared job file would otherwise copy this machine's
environment (secrets) into the job the service stores and hands to the job's code. Every problem (an unknown key, a wrong type, a missing
file) is a :class:`~ace3.cli.errors.CLIError` naming the key, with exit code 2.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic import ValidationError as PydanticValidationError

from ace3.cli.dataset_entries import DatasetEntry, OptionalDatasetEntry, check_dataset_ids
from ace3.cli.errors import BAD_INPUT, CLIError
from ace3.config import TrainingConfig
from ace3.errors import UnsupportedFeatureError
from ace3.hp import HPConfig
from ace3.locations import MODEL_SUPPORTED, SUPPORTED, refuse_url

OVERRIDE_RE = re.compile(r"^[A-Za-z_][\w-]*(\.[\w-]+)*=")
PATH_KEYS = ("model.path", "dataset", "validation_dataset")
INTERPOLATION_RE = re.compile(r"\$\{")
# ``${key}``, ``${a.b-c}``, ``${..sibling}``: a reference to another key of the file, nothing else.
PLAIN_REFERENCE_RE = re.compile(r"\$\{\.*[\w-]+(?:\.[\w-]+)*\}")
DIMENSION_TYPES = frozenset(
    ("uniform", "loguniform", "quniform", "qloguniform", "randint", "choice")
)


class ModelSection(BaseModel):
    """``model:``: the model code to upload and how to build it."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    factory: str = "build_model"
    entry_module: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)


class JobFile(BaseModel):
    """A validated job file (paths absolute)."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    model: ModelSection
    dataset: DatasetEntry
    validation_dataset: OptionalDatasetEntry = None
    training: TrainingConfig = Field(default_factory=TrainingConfig)

    @field_validator("training", mode="before")
    @classmethod
    def _empty_training(cls, value: Any) -> Any:
        return {} if value is None else value


class SearchFile(JobFile):
    """A validated search file: the job part, and ``search`` as an HPConfig whose
    ``base_config`` is ``training``."""

    search: dict[str, Any]
    hp_config: HPConfig | None = None


@dataclass
class Loaded:
    data: dict[str, Any]
    overridden: set[str]


def _problem(source: Path, message: str) -> CLIError:
    return CLIError(f"{source}: {message}", BAD_INPUT)


def check_overrides(overrides: list[str]) -> None:
    for item in overrides:
        if not OVERRIDE_RE.match(item):
            raise CLIError(
                f"override {item!r} is not key=value: write dotted keys, e.g. "
                "training.learning_rate=3e-4 or model.kwargs.hidden=128",
                BAD_INPUT,
            )


def calls_a_resolver(value: str) -> bool:
    """Whether ``value`` holds an interpolation other than a plain reference to a key (a
    resolver such as ``${oc.env:NAME}``, a nested ``${a.${b}}``)."""
    return len(INTERPOLATION_RE.findall(value)) != len(PLAIN_REFERENCE_RE.findall(value))


def _resolver_problem(where: str, key: str, value: str) -> CLIError:
    return CLIError(
        f"{where}{key}: {value!r} calls an interpolation resolver (${{name:...}}, such as "
        "oc.env) or nests interpolations, which job files may not: it would copy values from "
        "this machine (environment variables, secrets) into the job the service stores. Write "
        "the value itself; only plain references to other keys (${training.epochs}) are allowed",
        BAD_INPUT,
    )


def check_no_resolvers(source: Path, data: Any, key: str = "") -> None:
    """Refuse every string in ``data`` (the parsed YAML) that :func:`calls_a_resolver`."""
    if isinstance(data, dict):
        for name, value in data.items():
            check_no_resolvers(source, value, f"{key}.{name}" if key else str(name))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            check_no_resolvers(source, value, f"{key}[{index}]")
    elif isinstance(data, str) and calls_a_resolver(data):
        raise _resolver_problem(f"{source}: ", key, data)


def load_merged(path: str | Path, overrides: list[str]) -> Loaded:
    """The YAML file at ``path`` with ``overrides`` merged in, as plain data."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    source = Path(path)
    if not source.is_file():
        raise CLIError(f"job file not found: {source}", BAD_INPUT)
    check_overrides(overrides)
    # "model=x.py" sets the model's path, as "model: x.py" in the file does.
    overrides = [
        f"model.path={item[6:]}" if item.startswith("model=") else item for item in overrides
    ]
    try:
        import yaml

        raw = yaml.safe_load(source.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise _problem(source, f"cannot read it: {exc}") from exc
    except yaml.YAMLError as exc:
        raise _problem(source, f"not valid YAML: {exc}") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _problem(
            source,
            f"must be a mapping of keys (model:, dataset:, training:, ...), not {type(raw).__name__}",
        )
    if isinstance(raw.get("model"), str):
        raw["model"] = {"path": raw["model"]}
    check_no_resolvers(source, raw)
    for item in overrides:
        key, value = item.split("=", 1)
        if calls_a_resolver(value):
            raise _resolver_problem("override ", key, value)
    try:
        merged = OmegaConf.merge(OmegaConf.create(raw), OmegaConf.from_dotlist(overrides))
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as exc:
        raise _problem(source, f"cannot apply the overrides: {exc}".strip()) from exc
    assert isinstance(data, dict)
    return Loaded(
        {str(key): value for key, value in data.items()},
        {item.split("=", 1)[0] for item in overrides},
    )


def _lift_requirements(source: Path, data: dict[str, Any]) -> None:
    """``requirements:`` at the top of the file is ``training.requirements`` (where a job file
    names what the job needs beside its model and data); setting both is refused."""
    if "requirements" not in data:
        return
    value = data.pop("requirements")
    training = data.setdefault("training", {})
    if training is None:
        training = data["training"] = {}
    if not isinstance(training, dict):
        return  # validation names training:
    if training.get("requirements"):
        raise _problem(
            source,
            "requirements: and training.requirements: are both set; they are the same "
            "setting: keep one",
        )
    training["requirements"] = [] if value is None else value


def _resolve_paths(loaded: Loaded, source: Path) -> None:
    """Make the model and dataset paths absolute (file: its directory; overrides: the current
    directory) and check that they exist."""
    data = loaded.data
    for key in PATH_KEYS:
        holder, name = (data.get("model"), "path") if key == "model.path" else (data, key)
        if not isinstance(holder, dict) or not isinstance(holder.get(name), str):
            continue  # a stored dataset's {id: ...}, or what validation reports
        if not holder[name]:
            continue  # an empty path is not the current directory: validation names it
        try:
            refuse_url(holder[name], key, MODEL_SUPPORTED if key == "model.path" else SUPPORTED)
        except UnsupportedFeatureError as exc:
            raise CLIError(f"{source}: {exc}", BAD_INPUT) from None
        value = Path(holder[name]).expanduser()
        if not value.is_absolute():
            base = Path.cwd() if key in loaded.overridden else source.resolve().parent
            value = base / value
        if not value.exists():
            where = "given on the command line" if key in loaded.overridden else f"in {source}"
            raise CLIError(f"{key}: file not found: {value} ({where})", BAD_INPUT)
        holder[name] = str(value.resolve())


def load_job_file(path: str | Path, overrides: list[str]) -> JobFile:
    """The job file at ``path`` with ``overrides``, validated (see the module docstring)."""
    source = Path(path)
    loaded = load_merged(source, overrides)
    _lift_requirements(source, loaded.data)
    _check_keys(source, loaded.data, JobFile)
    check_dataset_ids(source, loaded.data)
    _resolve_paths(loaded, source)
    return _validate(source, JobFile, loaded.data)


def load_search_file(path: str | Path, overrides: list[str]) -> SearchFile:
    """The search file at ``path`` with ``overrides``: the job part and its HPConfig."""
    source = Path(path)
    loaded = load_merged(source, overrides)
    data = loaded.data
    _lift_requirements(source, data)
    _check_keys(source, data, SearchFile, hidden={"hp_config"})
    search = data.get("search")
    if not isinstance(search, dict):
        raise _problem(
            source,
            "search: a mapping is required (objective, direction, algorithm, max_trials, "
            "search_space, ...)",
        )
    if "base_config" in search:
        raise _problem(
            source, "search.base_config: put the settings every trial shares under training:"
        )
    check_dataset_ids(source, data)
    _resolve_paths(loaded, source)
    parsed = _validate(source, SearchFile, data)
    try:
        hp = HPConfig.model_validate({**search, "base_config": parsed.training})
    except PydanticValidationError as exc:
        raise _problem(
            source, describe(exc, HPConfig, ("search",), hidden={"base_config"})
        ) from None
    return parsed.model_copy(update={"hp_config": hp})


def _check_keys(
    source: Path,
    data: dict[str, Any],
    model: type[BaseModel],
    hidden: Collection[str] = frozenset(),
) -> None:
    """Unknown top-level keys first: one clear line each, before the pydantic messages."""
    valid = [name for name in model.model_fields if name not in hidden]
    unknown = [key for key in data if key not in valid]
    if unknown:
        raise _problem(source, "\n".join(unknown_key_message((key,), valid) for key in unknown))


def _validate(source: Path, model: type[Any], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except PydanticValidationError as exc:
        raise _problem(source, describe(exc, model, (), hidden={"hp_config"})) from None


# -- messages ---------------------------------------------------------------------------------


def dotted(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def unknown_key_message(loc: tuple[Any, ...], valid: list[str] | None) -> str:
    key = str(loc[-1])
    message = f"unknown key '{dotted(loc)}'"
    if valid:
        close = difflib.get_close_matches(key, valid, n=1)
        if close:
            message += f" (did you mean '{close[0]}'?)"
        parent = dotted(loc[:-1])
        message += f"; valid keys{' under ' + parent if parent else ''}: {', '.join(sorted(valid))}"
    return message


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``X``, ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType) or origin is typing.Annotated:
        found = [m for m in map(_model_in, typing.get_args(annotation)) if m is not None]
        return found[0] if len(found) == 1 else None
    return None


def fields_at(
    model: type[BaseModel], loc: tuple[Any, ...], hidden: Collection[str] = frozenset()
) -> list[str] | None:
    """The keys valid at ``loc`` inside ``model`` (None when the path leaves known models)."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or part not in current.model_fields:
            return None
        current = _model_in(current.model_fields[part].annotation)
    if current is None:
        return None
    return [name for name in current.model_fields if not (current is model and name in hidden)]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def describe(
    exc: PydanticValidationError,
    model: type[BaseModel],
    prefix: tuple[Any, ...] = (),
    hidden: Collection[str] = frozenset(),
) -> str:
    """One line per problem of ``exc``, each naming the dotted key it is about."""
    lines = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        if len(loc) > 2 and loc[0] == "search_space" and loc[2] in DIMENSION_TYPES:
            loc = loc[:2] + loc[3:]  # pydantic's union tag: not a key the user wrote
        full = prefix + loc
        if error["type"] == "extra_forbidden":
            lines.append(unknown_key_message(full, fields_at(model, loc[:-1], hidden)))
        elif error["type"] == "missing":
            lines.append(f"{dotted(full)}: required key missing")
        else:
            where = dotted(full) or dotted(prefix) or "(file)"
            message = str(error["msg"])
            if "input" in error and error["type"] not in ("value_error", "assertion_error"):
                message += f" (got {_short(error['input'])})"
            lines.append(f"{where}: {message}")
    return "invalid settings:\n  - " + "\n  - ".join(lines)
