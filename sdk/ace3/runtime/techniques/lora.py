"""``lora``: low-rank adapters (Hugging Face's ``peft``) on the layers ``target_modules`` names.

Applied on every rank by :func:`ace3.runtime.build.assemble` to the model the user code built,
after ``freeze``/``trainable`` and before the parallelism strategy places, casts, wraps or
shards it (FSDP2 then shards frozen base weights and adapters in the same units):
``peft.inject_adapter_in_model`` replaces each target layer by a LoRA layer that holds the
original one as ``base_layer`` (the same parameter objects) next to ``lora_A``/``lora_B``. Every
base parameter gets ``requires_grad=False`` (so no gradient, no all-reduce, no optimizer state);
the adapters train, and the biases ``bias`` names. Parameters that ``trainable`` names train
fully next to the adapters (peft's "modules to save"). The summary's parameter counts are taken
here, on whole tensors, and each adapted layer's structure is copied onto the meta device (the
merge computes each layer's update on a copy, and a sharded layer is not one to copy).

Checkpoints hold the adapters only: while adapters are on, the model's ``state_dict()`` leaves
out the frozen base parameters (a tied one under each of its names) and adds
:data:`FINGERPRINT_KEY`, the sha256 of the base weights as the model file built them (a
state-dict hook, so the plain format, the sharded (DCP) one of ZeRO-1/2/3 and the weights files
of hooks all follow without a branch of their own). A resumed attempt builds
the base again from the model file with the job's seed (the engine seeds torch before
``build_model``), injects the adapters and loads them; loading refuses a checkpoint whose
fingerprint differs from the rebuilt base's (another model file, or a model file whose weights
are not a function of the seed), and does not ask for the frozen base weights.

At the end (:mod:`ace3.runtime.techniques.lora_merge`): rank 0 writes the merged model (base weights plus
``lora_alpha / r * B @ A``, the original module names, float32; gathered from every rank under
ZeRO-2/3) to ``output_dir/artifacts/merged_model.safetensors`` for a job; an in-process run
hands the caller's module back with its own layers, the adapters merged into their weights.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from ace3.config import TrainingConfig

ADAPTER = "default"  # peft's adapter name; the parameter names hold it (fc1.lora_A.default...)
FINGERPRINT_KEY = "_ace3_lora_base_sha256"
_ATTRIBUTE = "_ace3_lora_adapters"  # on the adapted model: its LoRAAdapters
ADAPTABLE = (nn.Linear, nn.Embedding, nn.Conv1d, nn.Conv2d, nn.Conv3d)
ADAPTABLE_NAMES = "nn.Linear, nn.Embedding, nn.Conv1d/2d/3d, transformers' Conv1D"
ALL_LINEAR = "all-linear"
PEFT_HINT = (
    "lora needs the peft package where the training runs: pip install 'ace3[finetune]' "
    "(or pip install peft); workers install it with the worker extra"
)


def _peft() -> Any:
    try:
        import peft
    except ImportError as error:
        raise ImportError(f"{PEFT_HINT} ({error})") from error
    return peft


def _matches(name: str, pattern: str) -> bool:
    """A module's full name, its last components (``fc1`` matches ``layers.0.fc1``) or an
    fnmatch pattern over its full name."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def _hf_conv1d() -> type[nn.Module] | None:
    """``transformers``' ``Conv1D`` (GPT-2's attention and MLP layers: a Linear whose weight is
    stored transposed) when a model made of it was built: transformers is imported then, and
    never imported here otherwise."""
    utils = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(utils, "Conv1D", None)
    return conv1d if isinstance(conv1d, type) else None


def adaptable(module: nn.Module) -> bool:
    """A layer peft's LoRA adapts."""
    conv1d = _hf_conv1d()
    return isinstance(module, ADAPTABLE) or (conv1d is not None and isinstance(module, conv1d))


def _linear(module: nn.Module) -> bool:
    conv1d = _hf_conv1d()
    return isinstance(module, nn.Linear) or (conv1d is not None and isinstance(module, conv1d))


def _output_layer(model: nn.Module, linear: list[tuple[str, nn.Module]]) -> str | None:
    """The model's output layer: what ``get_output_embeddings()`` returns when the model has
    that method (a Hugging Face model's ``lm_head``; none when it returns None, as peft
    does), else its last Linear or Conv1D."""
    getter = getattr(model, "get_output_embeddings", None)
    if callable(getter):
        try:
            output = getter()
        except (NotImplementedError, AttributeError):
            output = None
        found = [name for name, module in linear if module is output]
        return found[0] if found else None
    return linear[-1][0] if linear else None


def _tied(model: nn.Module) -> dict[str, list[str]]:
    """Each module whose own parameter another module holds too (``tie_word_embeddings``:
    GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``) -> those other modules."""
    owners: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name.rpartition(".")[0])
    tied: dict[str, list[str]] = {}
    for modules in owners.values():
        for module in modules:
            others = [other for other in dict.fromkeys(modules) if other != module]
            if others:
                tied.setdefault(module, []).extend(others)
    return tied


def _refuse_tied(model: nn.Module, targets: list[str]) -> None:
    """A LoRA layer on a tied weight would merge its update into the weight the other module
    shares (and the exported config ties them again on loading): refused, naming both."""
    tied = _tied(model)
    for name in targets:
        if name in tied:
            raise ValueError(
                f"lora.target_modules: {name!r} shares its weight with "
                f"{', '.join(map(repr, tied[name]))} (tied weights, as tie_word_embeddings "
                "ties lm_head to the input embedding); LoRA cannot adapt a tied weight: "
                "leave it out ('all-linear' does)"
            )


def all_linear_targets(model: nn.Module) -> list[str]:
    """``target_modules="all-linear"``: every nn.Linear and Conv1D of the model except its
    output layer (:func:`_output_layer`) and any whose weight is tied to another module's.
    ValueError when that leaves none."""
    linear = [(name, module) for name, module in model.named_modules() if name and _linear(module)]
    output = _output_layer(model, linear)
    tied = _tied(model)
    targets = [name for name, _ in linear if name != output and name not in tied]
    if not targets:
        held = f" besides its output layer {output!r}" if output else ""
        raise ValueError(
            f"lora.target_modules: 'all-linear' finds no nn.Linear or Conv1D layer in the "
            f"model{held}; name the layers to adapt"
        )
    return targets


def select_targets(model: nn.Module, patterns: list[str] | str) -> list[str]:
    """The full names of the layers to adapt. ValueError naming the entry (and a few of the
    layers LoRA could adapt) when an entry matches no layer LoRA adapts."""
    if patterns == ALL_LINEAR:
        return all_linear_targets(model)
    named = [(name, module) for name, module in model.named_modules() if name]
    layers = [name for name, module in named if adaptable(module)]
    chosen: dict[str, None] = {}
    for pattern in patterns:
        hits = [n for n, m in named if adaptable(m) and _matches(n, pattern)]
        if not hits:
            others = [n for n, _ in named if _matches(n, pattern)]
            why = (
                f"matches {', '.join(others[:5])}, none of them a layer LoRA adapts"
                if others
                else "matches no module of the model"
            )
            shown = ", ".join(layers[:8]) + (
                f", ... ({len(layers)} in all)" if len(layers) > 8 else ""
            )
            raise ValueError(
                f"lora.target_modules: {pattern!r} {why} ({ADAPTABLE_NAMES}); layers it "
                f"could adapt: {shown or 'none'} (or 'all-linear')"
            )
        chosen.update(dict.fromkeys(hits))
    _refuse_tied(model, list(chosen))
    return list(chosen)


def base_fingerprint(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """sha256 over the names, shapes, dtypes and bytes of ``named`` (a uint8 tensor of 32)."""
    digest = hashlib.sha256()
    for name, tensor in named:
        value = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{tuple(value.shape)}|{value.dtype}|".encode())
        digest.update(value.view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return torch.frombuffer(bytearray(digest.digest()), dtype=torch.uint8).clone()


@dataclass
class LoRAAdapters:
    """The adapters injected into one model, and how its state dict leaves the base out."""

    model: nn.Module
    config: TrainingConfig
    layers: dict[str, nn.Module]  # full name -> peft's LoRA layer
    frozen: set[str]  # names (as the adapted model has them) of the frozen parameters
    fingerprint: torch.Tensor
    grad_before: dict[int, bool]  # id(parameter) -> requires_grad before injection
    # full name -> the layer's structure with its tensors on the meta device, copied before a
    # strategy shards the model (the merge computes each layer's update on a copy of it)
    templates: dict[str, nn.Module] = field(default_factory=dict)
    handles: list[Any] = field(default_factory=list)
    whole: bool = False  # state_dict() keeps everything (for the merge)
    trainable: int = 0  # parameter elements, counted whole before any sharding
    total: int = 0

    # -- figures --------------------------------------------------------------------------------
    def counts(self) -> tuple[int, int]:
        """(trainable, total) parameter elements of the adapted model, as counted when the
        adapters were injected (whole tensors, before a strategy shards them)."""
        return self.trainable, self.total

    def summary(self) -> dict[str, Any]:
        trainable, total = self.counts()
        return {"trainable_parameters": trainable, "total_parameters": total}

    def describe(self) -> str:
        lora = self.config.lora
        assert lora is not None
        trainable, total = self.counts()
        names = list(self.layers)
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        return (
            f"LoRA r={lora.r} alpha={lora.lora_alpha:g} dropout={lora.lora_dropout:g} "
            f"bias={lora.bias} on {len(names)} layer(s) ({shown}): training {trainable:,} of "
            f"{total:,} parameters ({trainable / total:.2%}); the base weights are frozen"
        )

    # -- the state dict: adapters only ----------------------------------------------------------
    def _install_hooks(self) -> None:
        model = self.model
        # (torch marks the hook objects it is given: plain functions, not bound methods)
        self.handles = [
            model.register_state_dict_post_hook(
                functools.partial(type(self)._leave_base_out, self)
            ),
            model.register_load_state_dict_pre_hook(
                functools.partial(type(self)._check_fingerprint, self)
            ),
            model.register_load_state_dict_post_hook(
                functools.partial(type(self)._base_not_missing, self)
            ),
        ]

    def _leave_base_out(self, module: nn.Module, state: Any, prefix: str, _: Any) -> None:
        if self.whole:
            return
        for name in self.frozen:
            state.pop(prefix + name, None)
        state[prefix + FINGERPRINT_KEY] = self.fingerprint.clone()

    def _check_fingerprint(self, module: nn.Module, state: Any, prefix: str, *_: Any) -> None:
        saved = state.pop(prefix + FINGERPRINT_KEY, None)
        if saved is None:
            return
        if not torch.equal(saved.detach().to("cpu", torch.uint8), self.fingerprint):
            raise ValueError(
                "these LoRA adapters were trained on other base weights than the ones the "
                "model was built with now (the checkpoint holds the adapters and a fingerprint "
                "of their base; the base is rebuilt from the model file and the job's seed): "
                "use the same model file, and build its weights from the seed or from files "
                "it ships"
            )

    def _base_not_missing(self, module: nn.Module, keys: Any) -> None:
        keys.missing_keys[:] = [key for key in keys.missing_keys if key not in self.frozen]

    @contextlib.contextmanager
    def whole_state(self) -> Iterator[None]:
        """``state_dict()`` with the base weights (and no fingerprint) inside this block."""
        self.whole = True
        try:
            yield
        finally:
            self.whole = False

    # -- the end --------------------------------------------------------------------------------
    @torch.no_grad()
    def unload(self, merge: bool) -> None:
        """Give the model its own layers back (with ``merge``, each with its adapters merged
        into its weights: peft's merge) and the ``requires_grad`` flags it had; remove the
        state-dict hooks."""
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.model.__dict__.pop(_ATTRIBUTE, None)
        for name, layer in self.layers.items():
            if merge:
                layer.merge(safe_merge=True, adapter_names=[ADAPTER])
            parent_name, _, child = name.rpartition(".")
            parent = self.model.get_submodule(parent_name) if parent_name else self.model
            setattr(parent, child, layer.get_base_layer())
        for param in self.model.parameters():
            param.requires_grad_(self.grad_before.get(id(param), True))
        self.layers = {}


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are on the meta device (no memory):
    its structure, to be given real tensors later (``to_empty`` and ``load_state_dict``)."""
    memo: dict[int, Any] = {}
    for param in module.parameters():
        memo[id(param)] = nn.Parameter(
            torch.empty(param.shape, dtype=param.dtype, device="meta"), param.requires_grad
        )
    for buffer in module.buffers():
        memo[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device="meta")
    return copy.deepcopy(module, memo)


def apply_lora(model: nn.Module, config: TrainingConfig) -> LoRAAdapters | None:
    """Inject ``config.lora``'s adapters into ``model`` in place (None without ``lora``); see
    the module docstring. Call after :func:`ace3.runtime.techniques.freezing.apply_freezing`."""
    lora = config.lora
    if lora is None:
        return None
    targets = select_targets(model, lora.target_modules)
    peft = _peft()
    grad_before = {id(p): p.requires_grad for p in model.parameters()}
    # trainable=[...] with lora: what apply_freezing left trainable trains fully
    keep = {id(p) for p in model.parameters() if p.requires_grad} if config.trainable else set()
    peft_config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        bias=lora.bias,
        target_modules="^(?:" + "|".join(map(re.escape, targets)) + ")$",
    )
    with warnings.catch_warnings():
        # peft sets fan_in_fan_out per layer (True for Conv1D, whose weight is transposed) and
        # warns each time it flips it
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        peft.inject_adapter_in_model(peft_config, model, adapter_name=ADAPTER)
    for param in model.parameters():
        if id(param) in keep:
            param.requires_grad_(True)
    layers = {name: model.get_submodule(name) for name in targets}
    named = list(model.named_parameters())  # (a tied weight once)
    frozen = [(name, param) for name, param in named if not param.requires_grad]
    # every name a frozen tensor has: a tied weight (GPT-2's lm_head is wte) under each
    every_name = model.named_parameters(remove_duplicate=False)
    adapters = LoRAAdapters(
        model=model,
        config=config,
        layers=layers,
        frozen={name for name, param in every_name if not param.requires_grad},
        fingerprint=base_fingerprint(frozen),
        grad_before=grad_before,
        templates={name: meta_copy(layer) for name, layer in layers.items()},
        trainable=sum(p.numel() for _, p in named if p.requires_grad),
        total=sum(p.numel() for _, p in named),
    )
    adapters._install_hooks()
    model.__dict__[_ATTRIBUTE] = adapters
    return adapters


def remove_adapters(model: nn.Module, merge: bool) -> None:
    """Undo :func:`apply_lora` on ``model`` if it was applied (see
    :meth:`LoRAAdapters.unload`): an in-process run's end (``merge``), or a build that failed
    (the caller's module as it was given)."""
    adapters = model.__dict__.get(_ATTRIBUTE)
    if isinstance(adapters, LoRAAdapters):
        adapters.unload(merge)
