"""Sample completions at each validation (:class:`EvalSampleFields`), a part of
:class:`~ace3.config.training.TrainingConfig` kept apart so that the training schema stays
readable. What the engine does with them: :mod:`ace3.runtime.loop.eval_samples`; the record it
writes: :class:`ace3.config.events.EvalSamplesRecord`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

MAX_EVAL_PROMPTS = 16
MAX_EVAL_PROMPT_CHARS = 4000
MAX_EVAL_NEW_TOKENS = 512

# Any text but NUL, which no database text column (nor a JSONB string) can hold.
EvalPrompt = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_EVAL_PROMPT_CHARS, pattern=r"^[^\x00]+$")
]


class EvalSampleFields(BaseModel):
    """``eval_prompts``: a Hugging Face model (``kind='huggingface'``) writes what it completes
    for each of these prompts at every validation, greedily and at most
    ``eval_max_new_tokens`` tokens each (an ``eval_samples`` record: ``GET
    /v1/jobs/{id}/records?type=eval_samples``, ``handle.eval_samples()``). On a chat dataset
    each prompt is one user message rendered with the tokenizer's chat template and its
    generation prompt; otherwise the prompt's own text is tokenized as it is."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    eval_prompts: list[EvalPrompt] | None = Field(
        None,
        min_length=1,
        max_length=MAX_EVAL_PROMPTS,
        description="Prompts a Hugging Face model completes at every validation (greedy), kept "
        f"as eval_samples records: at most {MAX_EVAL_PROMPTS}, each 1-{MAX_EVAL_PROMPT_CHARS} "
        "characters. A chat dataset's model gets each as a user message (its chat template); "
        "otherwise the text as it is.",
    )
    eval_max_new_tokens: int = Field(
        64,
        ge=1,
        le=MAX_EVAL_NEW_TOKENS,
        description="The most tokens generated for each of eval_prompts.",
    )
