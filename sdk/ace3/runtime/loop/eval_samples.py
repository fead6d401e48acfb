"""``eval_prompts``: at every validation a Hugging Face model completes each prompt greedily
(``generate(do_sample=False, max_new_tokens=eval_max_new_tokens)``, eval mode, no gradients,
LoRA adapters active) and rank 0 writes one ``eval_samples`` record
(:class:`ace3.config.events.EvalSamplesRecord`).

The prompts are tokenized once, at build: on a chat dataset each is one user message rendered
with the tokenizer's chat template and its generation prompt; otherwise its text is tokenized as
the training text records are (no special tokens added). A prompt whose tokens and the new ones
do not fit the model's context keeps its last tokens. They are generated as one left-padded
batch. A sharded model (ZeRO-2/3: FSDP modules, whose forward passes are collectives) generates
on every rank with the same inputs and ``synced_gpus`` (every rank runs as many forward passes
as the longest-running one needs); an unsharded one generates on rank 0 only. Each text is cut
to :data:`~ace3.config.events.MAX_SAMPLE_TEXT_CHARS` characters, and all of them further until
the record's line fits :data:`~ace3.config.events.MAX_LINE_BYTES`; ``truncated`` says so.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ace3.config.events import (
    MAX_LINE_BYTES,
    MAX_SAMPLE_TEXT_CHARS,
    EvalSample,
    EvalSamplesRecord,
    encode_record,
)
from ace3.runtime.data.text_masking import chat_template_of
from ace3.runtime.loop.extensions import LoopExtension
from ace3.runtime.loop.precision import Precision
from ace3.runtime.loop.view import LoopView

_NOT_SAMPLE_TEXT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def sample_text(text: str) -> str:
    """``text`` as a record may carry it: line ends as ``\\n``, every other control character
    (but a tab) as U+FFFD."""
    return _NOT_SAMPLE_TEXT.sub("\ufffd", text.replace("\r\n", "\n").replace("\r", "\n"))


@dataclass(frozen=True)
class Completion:
    """One prompt (as given), what the model wrote after it, and whether its tokens were cut
    to fit the model's context."""

    prompt: str
    completion: str
    completion_tokens: int
    prompt_cut: bool = False


def samples_record(
    step: int, epoch: float | None, max_new_tokens: int, completions: Sequence[Completion]
) -> EvalSamplesRecord:
    """The record of ``completions``, each text cut to :data:`MAX_SAMPLE_TEXT_CHARS` characters
    and, while the line is longer than :data:`MAX_LINE_BYTES`, all of them to half as many."""
    limit = MAX_SAMPLE_TEXT_CHARS
    while True:
        samples = []
        for item in completions:
            prompt, completion = sample_text(item.prompt), sample_text(item.completion)
            samples.append(
                EvalSample(
                    prompt=prompt[:limit],
                    completion=completion[:limit],
                    completion_tokens=item.completion_tokens,
                    truncated=item.prompt_cut or max(len(prompt), len(completion)) > limit,
                )
            )
        record = EvalSamplesRecord(
            step=step, epoch=epoch, max_new_tokens=max_new_tokens, samples=samples
        )
        if len(encode_record(record).encode()) <= MAX_LINE_BYTES or limit == 0:
            return record
        limit //= 2


def prompt_token_ids(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """The tokens ``prompt`` is generated after (see the module docstring)."""
    if chat:
        chat_template_of(tokenizer)  # (a clear refusal without one)
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            tokenize=True,
            add_generation_prompt=True,
            return_dict=True,
        )
        ids = [int(token) for token in rendered["input_ids"]]
    else:
        ids = [int(token) for token in tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    if not ids:  # (a prompt of only whitespace, for some tokenizers)
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else None
        ids = [int(start if start is not None else tokenizer.eos_token_id or 0)]
    return ids


def _sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(module, FSDPModule) for module in model.modules())


def _eos_ids(model: nn.Module, tokenizer: Any) -> set[int]:
    found: set[int] = set()
    config = getattr(model, "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(value, int):
            found.add(value)
        elif isinstance(value, list | tuple):
            found.update(int(item) for item in value)
    return found


class EvalSamples(LoopExtension):
    """Generates the completions of ``eval_prompts`` after each validation (every rank calls
    it; see the module docstring for which ones generate)."""

    def __init__(
        self,
        prompts: Sequence[str],
        tokenizer: Any,
        chat: bool,
        max_new_tokens: int,
        context: int | None,
        precision: Precision,
        pad_id: int,
    ) -> None:
        room = None if context is None else context - max_new_tokens
        if context is not None and room is not None and room < 1:
            raise ValueError(
                f"eval_max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                f"model's context of {context} tokens: use at most {context - 1}"
            )
        self.prompts = list(prompts)
        self.tokenizer, self.precision, self.pad_id = tokenizer, precision, pad_id
        self.max_new_tokens = max_new_tokens
        self.token_ids: list[list[int]] = []
        self.cut: list[bool] = []
        for prompt in self.prompts:
            ids = prompt_token_ids(tokenizer, prompt, chat)
            self.cut.append(room is not None and len(ids) > room)
            self.token_ids.append(ids[-room:] if room is not None else ids)

    def _batch(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompts left-padded to the longest, and their attention mask."""
        longest = max(len(ids) for ids in self.token_ids)
        input_ids = torch.full((len(self.token_ids), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for row, ids in enumerate(self.token_ids):
            input_ids[row, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            mask[row, longest - len(ids) :] = 1
        return input_ids.to(device), mask.to(device)

    @torch.no_grad()
    def generate(self, model: nn.Module, device: torch.device, synced: bool) -> list[Completion]:
        """Each prompt's completion, greedy (``synced``: every rank of a sharded model)."""
        input_ids, mask = self._batch(device)
        was_training = model.training
        model.eval()
        try:
            with self.precision.autocast():
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=mask,
                    max_new_tokens=self.max_new_tokens,
                    do_sample=False,
                    num_beams=1,
                    use_cache=True,
                    pad_token_id=self.pad_id,
                    synced_gpus=synced,
                )
        finally:
            model.train(was_training)
        eos = _eos_ids(model, self.tokenizer)
        completions = []
        for row, prompt in enumerate(self.prompts):
            new = [int(token) for token in output[row, input_ids.shape[1] :].tolist()]
            end = next((at for at, token in enumerate(new) if token in eos), len(new))
            text = self.tokenizer.decode(new[:end], skip_special_tokens=True)
            completions.append(Completion(prompt, text, end, self.cut[row]))
        return completions

    def after_validation(self, loop: LoopView) -> None:
        model = loop.parts.model
        sharded = _sharded(model)
        if not sharded and not loop.ctx.is_main:
            return
        synced = sharded and dist.is_initialized() and dist.get_world_size() > 1
        try:
            completions = self.generate(model, loop.ctx.device, synced)
        finally:
            if sharded:  # ZeRO-2 keeps the parameters gathered after a forward without backward
                from ace3.runtime.parallel.sharding import reshard

                reshard(model)
        state = loop.state
        record = samples_record(state.step, state.display_epoch(), self.max_new_tokens, completions)
        loop.events.eval_samples(record)
        loop.log(f"eval_samples at step {state.step}: {len(completions)} completion(s)")
