"""What an OpenAI fine-tuning request means to ACE3, and what an ACE3 job shows back.

- Statuses: :data:`STATUSES` (ACE3 state -> OpenAI status).
- ``method``: only ``supervised``, which trains with LoRA by default (:data:`DEFAULT_LORA`:
  rank 8, alpha 16, every Linear and Conv1D but the output layer); ``extra_body={"ace3":
  {"lora": null}}`` asks for full fine-tuning, ``{"ace3": {"lora": {...}}}`` for other adapters.
- Hyperparameters: ``n_epochs`` -> ``epochs`` (auto: 3), ``batch_size`` -> ``batch_size``
  (auto: 8), ``learning_rate_multiplier`` x the base rate (:data:`LORA_BASE_LEARNING_RATE` with
  LoRA, :data:`FULL_BASE_LEARNING_RATE` without; auto: 1). ``seed`` -> ``seed``. OpenAI's
  ranges (:data:`HYPERPARAMETER_RANGES`); a value out of range is a 400 naming it as the caller
  wrote it (``hyperparameters.n_epochs``). ``metadata``: OpenAI's limits (16 keys of at most 64
  characters, string values of at most 512).
- ``extra_body={"ace3": {...}}``: any other :class:`ace3.config.TrainingConfig` field, validated
  by it (a bad field is a 400 naming ``ace3.<field>``). A field the OpenAI request sets too
  (``epochs`` beside ``n_epochs``, ...) is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ace3.config import TrainingConfig
from ace3.config.states import JobState
from ace3_server.openai_api.errors import OpenAIError

STATUSES: dict[str, str] = {
    JobState.QUEUED: "queued",
    JobState.STARTING: "validating_files",  # the worker fetches the files and checks their sha256
    JobState.RUNNING: "running",
    JobState.CANCELLING: "running",  # it runs until its processes have stopped
    JobState.SUCCEEDED: "succeeded",
    JobState.FAILED: "failed",
    JobState.CANCELLED: "cancelled",
}
HYPERPARAMETERS = ("n_epochs", "batch_size", "learning_rate_multiplier")
#: OpenAI's ranges (learning_rate_multiplier: above 0, finite); ACE3's own wider ones are the
#: TrainingConfig fields under ``ace3`` (:data:`_SETS`).
HYPERPARAMETER_RANGES: dict[str, tuple[float, float]] = {
    "n_epochs": (1, 50), "batch_size": (1, 256), "learning_rate_multiplier": (0, 1e3)}  # fmt: skip
_SETS = {"n_epochs": "epochs", "batch_size": "batch_size"}
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
AUTO_EPOCHS = 3  # TrainingConfig's own default (epoch_count)
AUTO_BATCH_SIZE = 8
LORA_BASE_LEARNING_RATE = 2e-4
FULL_BASE_LEARNING_RATE = 2e-5
DEFAULT_LORA: dict[str, Any] = {"r": 8, "lora_alpha": 16.0, "target_modules": "all-linear"}
#: ACE3 fields an OpenAI field sets; giving both is refused.
_SET_BY = {"epochs": "n_epochs", "batch_size": "batch_size", "learning_rate": "learning_rate_multiplier", "seed": "seed"}  # fmt: skip


class FineTuningJobCreate(BaseModel):
    """``POST /openai/v1/fine_tuning/jobs``: OpenAI's fields, and ACE3's own under ``ace3``."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(min_length=1, max_length=200)
    training_file: str = Field(min_length=1, max_length=64)
    validation_file: str | None = Field(None, min_length=1, max_length=64)
    hyperparameters: dict[str, Any] | None = None
    method: dict[str, Any] | None = None
    suffix: str | None = Field(None, max_length=64)
    seed: int | None = Field(None, ge=0, le=2**31 - 1)
    metadata: dict[str, str] | None = None
    integrations: list[Any] | None = Field(None, max_length=0)
    ace3: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_within_limits(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        """OpenAI's limits: 16 keys, keys of 64 characters, values of 512."""
        if value is None:
            return value
        if len(value) > METADATA_KEYS:
            raise ValueError(f"at most {METADATA_KEYS} keys, not {len(value)}")
        for key, text in value.items():
            if len(key) > METADATA_KEY_CHARS:
                raise ValueError(f"key {key[:20]!r}...: at most {METADATA_KEY_CHARS} characters")
            if len(text) > METADATA_VALUE_CHARS:
                raise ValueError(f"{key!r}'s value: at most {METADATA_VALUE_CHARS} characters")
        return value


def status_of(state: str) -> str:
    return STATUSES.get(state, "running")


def _check_hyperparameters(values: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(values) - set(HYPERPARAMETERS))
    if unknown:
        raise OpenAIError(
            400,
            f"unknown hyperparameter(s) {', '.join(map(repr, unknown))} in {where}: the "
            f"hyperparameters are {', '.join(HYPERPARAMETERS)}; ACE3's other settings go in "
            "extra_body={'ace3': {...}} (TrainingConfig's fields)",
            param=f"{where}.{unknown[0]}",
        )
    for name, value in values.items():
        if value == "auto":
            continue
        low, high = HYPERPARAMETER_RANGES[name]
        if name == "learning_rate_multiplier":
            fits = isinstance(value, int | float) and low < value <= high  # (NaN never fits)
            wanted = f"a number above {low:g} and at most {high:g}"
        else:
            fits = isinstance(value, int) and low <= value <= high
            wanted = f"an integer from {low:g} to {high:g} (more: extra_body={{'ace3': {{'"
            wanted += f"{_SETS[name]}': ...}}}} instead)"
        if isinstance(value, bool) or not fits:
            raise OpenAIError(
                400, f"{name} must be 'auto' or {wanted}, not {value!r}", param=f"{where}.{name}"
            )
    return values


def requested_hyperparameters(body: FineTuningJobCreate) -> dict[str, Any]:
    """The hyperparameters asked for, from ``method.supervised.hyperparameters`` or the
    top-level ``hyperparameters`` (not both); 400 for another method or an unknown name."""
    top = body.hyperparameters
    method = body.method or {"type": "supervised"}
    kind = method.get("type")
    if kind != "supervised":
        raise OpenAIError(
            400,
            f"method.type {kind!r} is not supported: ACE3 fine-tunes with 'supervised' only",
            param="method.type",
        )
    unknown = sorted(set(method) - {"type", "supervised"})
    if unknown:
        raise OpenAIError(
            400, f"unknown field(s) {unknown} in method", param=f"method.{unknown[0]}"
        )
    supervised = method.get("supervised") or {}
    if not isinstance(supervised, dict) or set(supervised) - {"hyperparameters"}:
        raise OpenAIError(
            400, "method.supervised takes only 'hyperparameters'", param="method.supervised"
        )
    nested = supervised.get("hyperparameters")
    if nested is not None and top is not None:
        raise OpenAIError(
            400,
            "hyperparameters are given twice: use method.supervised.hyperparameters only",
            param="hyperparameters",
        )
    if nested is not None:
        if not isinstance(nested, dict):
            raise OpenAIError(400, "must be an object", param="method.supervised.hyperparameters")
        return _check_hyperparameters(nested, "method.supervised.hyperparameters")
    return _check_hyperparameters(top or {}, "hyperparameters")


def base_learning_rate(config: TrainingConfig | dict[str, Any]) -> float:
    lora = config.get("lora") if isinstance(config, dict) else config.lora
    return LORA_BASE_LEARNING_RATE if lora is not None else FULL_BASE_LEARNING_RATE


def training_config(body: FineTuningJobCreate) -> TrainingConfig:
    """The job's config: ``body.ace3`` with the hyperparameters, the seed and LoRA mapped in
    (see the module docstring); 400 naming the field at fault."""
    wanted = requested_hyperparameters(body)
    fields = dict(body.ace3 or {})
    asked = {k for k, v in wanted.items() if v != "auto"} | (
        {"seed"} if body.seed is not None else set()
    )
    for field, openai_name in _SET_BY.items():
        if field in fields and openai_name in asked:
            raise OpenAIError(
                400,
                f"ace3.{field} and {openai_name} both set it: give one",
                param=f"ace3.{field}",
            )
    fields.setdefault("lora", DEFAULT_LORA)
    epochs, batch = wanted.get("n_epochs", "auto"), wanted.get("batch_size", "auto")
    if epochs != "auto":
        fields["epochs"] = epochs
    fields["batch_size"] = batch if batch != "auto" else fields.get("batch_size", AUTO_BATCH_SIZE)
    multiplier = wanted.get("learning_rate_multiplier", "auto")
    if multiplier != "auto" or "learning_rate" not in fields:
        scale = 1.0 if multiplier == "auto" else float(multiplier)
        fields["learning_rate"] = scale * base_learning_rate(fields)
    if body.seed is not None:
        fields["seed"] = body.seed
    try:
        return TrainingConfig.model_validate(fields)
    except ValidationError as exc:
        problems = [
            f"ace3.{'.'.join(map(str, e['loc']))}: {e['msg']}" if e["loc"] else e["msg"]
            for e in exc.errors()
        ]
        first = exc.errors()[0]["loc"]
        raise OpenAIError(
            400,
            "; ".join(problems),
            param=f"ace3.{'.'.join(map(str, first))}" if first else "ace3",
        ) from None


def resolved_hyperparameters(config: dict[str, Any]) -> dict[str, Any]:
    """What a job trains with, in OpenAI's terms (its stored config read back)."""
    rate = config.get("learning_rate") or 0.0
    return {
        "n_epochs": config.get("epochs") or AUTO_EPOCHS,
        "batch_size": config.get("batch_size"),
        "learning_rate_multiplier": round(rate / base_learning_rate(config), 10),
    }
