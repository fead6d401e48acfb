"""Speed settings (:mod:`ace3.config.speed`) in the engine: ``torch.compile`` of the model,
TF32 and the attention kernels. (``optimizer_impl`` is applied where the optimizer is built,
:func:`ace3.runtime.loop.optim.implementation_args`.)

**compile** (:func:`compile_model`): the rank's module is compiled *in place*: its ``forward``
becomes ``torch.compile(module.forward)`` (an instance attribute; ``nn.Module.compile`` compiles
``nn.Module._call_impl``, which dynamo skips in torch 2.13, so nothing would be compiled), after the strategy has placed it, turned gradient checkpointing on and,
at ZeRO-2/3, sharded it with FSDP2 ``fully_shard`` (dynamo runs FSDP's hooks eagerly between
the compiled graphs); DDP then wraps the compiled module (compile first, then wrap, as
torchtitan does: the gradients are all-reduced in DDP's buckets as each compiled backward
hands them over). In place means the module keeps its own parameter names: checkpoints,
downloads and ``init_from`` see no ``_orig_mod.`` prefix. Validation runs the same compiled
module (in eval mode: one more graph). An in-process run leaves the caller's module
uncompiled at the end (:func:`uncompile`). Pipeline and tensor parallelism are refused
(:func:`ace3.config.section_checks.speed_problems`).

**allow_tf32** and **attention_backend** (:func:`speed_settings`): a context around the whole
run (build, training, validation, saves). On CUDA, TF32 is turned on for matmuls and cuDNN
and put back as it was afterwards; on a CPU device there is no TF32 and nothing changes.
``attention_backend`` other than ``auto`` restricts ``F.scaled_dot_product_attention`` to that
kernel with ``torch.nn.attention.sdpa_kernel``; ``flash`` and ``efficient`` are CUDA kernels, so
a run on another device is refused with :class:`ace3.errors.UnsupportedFeatureError`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from ace3.config import ConfigProblem, TrainingConfig
from ace3.config.speed import CUDA_ONLY_ATTENTION
from ace3.errors import UnsupportedFeatureError
from ace3.runtime.techniques.grad_checkpointing import largest_sequential

__all__ = ["compile_model", "speed_settings", "uncompile"]

_EAGER_FORWARD = "_ace3_eager_forward"  # on a compiled module: its instance forward before


def compile_model(model: nn.Module, config: TrainingConfig) -> str | None:
    """``torch.compile`` ``model`` in place when ``config.compile``; return a sentence for the
    log (None when off). With gradient checkpointing or FSDP (ZeRO-2/3) each layer of the
    model's largest ``nn.Sequential`` is compiled on its own (the checkpointed segments and
    FSDP's units run them: a whole-model graph would break at each of them)."""
    if not config.compile:
        return None
    targets, what = [model], "the model"
    if config.gradient_checkpointing or config.effective_zero_stage >= 2:
        found = largest_sequential(model)
        if found is not None:
            label, sequential = found
            targets = [layer for layer in sequential if any(True for _ in layer.parameters())]
            what = f"each of the {len(targets)} layers of {label}"
    for target in targets or [model]:
        _compile_forward(target, config)
    full = ", fullgraph" if config.compile_fullgraph else ""
    return f"torch.compile: {what}, in place (mode={config.compile_mode}{full})"


def _compile_forward(module: nn.Module, config: TrainingConfig) -> None:
    own = module.__dict__.get("forward")  # e.g. gradient checkpointing's, kept inside
    setattr(module, _EAGER_FORWARD, own)
    module.forward = torch.compile(
        module.forward, mode=config.compile_mode, fullgraph=config.compile_fullgraph
    )


def uncompile(model: nn.Module) -> None:
    """Undo :func:`compile_model` on ``model`` and its submodules (they run eagerly again)."""
    for module in model.modules():
        if _EAGER_FORWARD not in module.__dict__:
            continue
        own = module.__dict__.pop(_EAGER_FORWARD)
        if own is None:
            del module.forward
        else:
            module.forward = own


def _attention_backends(name: str) -> list[object]:
    from torch.nn.attention import SDPBackend

    return [
        {
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH,
        }[name]
    ]


def check_device(config: TrainingConfig, device: torch.device) -> None:
    """Refuse what the device cannot run: flash and memory-efficient attention off CUDA."""
    backend = config.attention_backend
    if backend in CUDA_ONLY_ATTENTION and device.type != "cuda":
        reason = (
            f"attention_backend={backend!r}: the {backend} attention kernels run on CUDA GPUs "
            f"only and this run's device is {device.type}; use 'auto' or 'math'"
        )
        raise UnsupportedFeatureError(
            reason, [ConfigProblem(field="attention_backend", reason=reason)]
        )


@contextlib.contextmanager
def speed_settings(config: TrainingConfig, device: torch.device) -> Iterator[None]:
    """TF32 (CUDA) and the attention kernels for the whole run (see the module docstring)."""
    check_device(config, device)
    with contextlib.ExitStack() as stack:
        if config.allow_tf32 and device.type == "cuda":
            matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True

            def restore() -> None:
                torch.backends.cuda.matmul.allow_tf32 = matmul
                torch.backends.cudnn.allow_tf32 = cudnn

            stack.callback(restore)
        if config.attention_backend != "auto":
            from torch.nn.attention import sdpa_kernel

            stack.enter_context(sdpa_kernel(_attention_backends(config.attention_backend)))
        yield
