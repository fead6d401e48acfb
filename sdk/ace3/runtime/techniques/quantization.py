"""Post-training quantization (``TrainingConfig.quantization``): after the final checkpoint,
an int8 copy of the trained model, written as an artifact and validated next to the float one.

Every rank (they all hold the whole trained model: data parallelism, ZeRO 0 or 1; other layouts
are refused by :func:`ace3.config.unsupported_settings`) takes a float32 CPU copy of it and
quantizes the matching Linear layers with torchao: int8 weights with one scale per output row,
and int8 activations, ``dynamic`` (a scale per input row, computed as it comes) or ``static``
(one fixed scale per layer input, the largest magnitude seen over ``calibration_steps``
training batches on every rank, agreed with a MAX all-reduce, so every rank builds the same
model). Rank 0 writes ``artifacts/quantized/model-int8.safetensors``
(:mod:`ace3.training.quantized`: plain tensors, no pickled code). Then every rank validates
its shard of the validation set with the int8 model on the CPU (where torchao's int8 kernels
run everywhere) and the sums are reduced: the exact metrics over the whole set.

The summary gets ``quantized_val_loss`` / ``quantized_val_accuracy`` next to the float model's
final ``val_loss`` / ``val_accuracy``, their differences (``quantized_accuracy_delta`` = int8 -
float accuracy, ``quantized_loss_delta``), ``quantized_size_bytes`` (the artifact file),
``float_size_bytes`` (the float model's tensors: the same state dict in float) and their ratio.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ace3.config.compression import QuantizationConfig
from ace3.runtime.loop.evaluation import evaluate
from ace3.runtime.loop.extensions import LoopExtension, matching_modules
from ace3.runtime.loop.losses import forward_loss, move_to_device
from ace3.runtime.loop.precision import Precision
from ace3.runtime.loop.view import LoopView
from ace3.runtime.process.distributed import barrier
from ace3.training.quantized import import_torchao, save_quantized_model

ARTIFACT = "quantized/model-int8.safetensors"
CPU = torch.device("cpu")


def float_copy(model: nn.Module) -> nn.Module:
    """A float32 CPU copy of ``model`` in eval mode, without gradients."""
    clone = copy.deepcopy(model).to(CPU).float().eval()
    for param in clone.parameters():
        param.grad = None
        param.requires_grad_(False)
    return clone


def quantize_linear(module: nn.Linear, method: str, act_scale: torch.Tensor | None) -> None:
    """Replace the weight of ``module`` by torchao's int8 weight for ``method``."""
    ao = import_torchao()
    from torchao.quantization.granularity import PerRow, PerTensor

    if method == "dynamic":
        config = ao.Int8DynamicActivationInt8WeightConfig(set_inductor_config=False)
    else:
        config = ao.Int8StaticActivationInt8WeightConfig(
            act_quant_scale=act_scale, granularity=[PerTensor(), PerRow()],
            set_inductor_config=False,
        )  # fmt: skip
    ao.quantize_(module, config, filter_fn=lambda _module, name: name == "")


class PostTrainingQuantization(LoopExtension):
    """Quantizes the trained model at the end of the run (see the module docstring)."""

    def __init__(self, settings: QuantizationConfig, model: nn.Module) -> None:
        import_torchao()  # an install hint before training, not after it
        self.settings = settings
        self.names = [
            name
            for name, _ in matching_modules(
                model, settings.target_modules, (nn.Linear,), "quantization.target_modules"
            )
        ]

    def _calibrate(self, model: nn.Module, loop: LoopView) -> dict[str, torch.Tensor]:
        """The static activation scale of each layer's input (see the module docstring)."""
        from torchao.quantization.quant_primitives import MappingType, choose_qparams_affine

        parts, ctx = loop.parts, loop.ctx
        modules = dict(model.named_modules())
        largest = {name: torch.zeros((), dtype=torch.float32) for name in self.names}
        ndims: dict[str, int] = {}

        def observe(name: str) -> Any:
            def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
                value = args[0].detach()
                largest[name] = torch.maximum(largest[name], value.abs().max().float())
                if ndims.setdefault(name, value.ndim) != value.ndim:
                    raise ValueError(
                        f"quantization: layer {name!r} got inputs of {ndims[name]} and "
                        f"{value.ndim} dimensions; method='static' needs one shape of input"
                    )

            return hook

        handles = [modules[name].register_forward_pre_hook(observe(name)) for name in self.names]
        # (the first batches of an epoch, read apart from the run's: a stream's position stays)
        loader = loop.train_data.first_batches(parts.collate_fn)
        batches = 0
        try:
            with torch.no_grad():
                for raw in itertools.islice(loader, self.settings.calibration_batches):
                    forward_loss(model, move_to_device(raw, CPU), parts.user.compute_loss)
                    batches += 1
        finally:
            for handle in handles:
                handle.remove()
        agreed = torch.stack([largest[name] for name in self.names]).to(ctx.device)
        if ctx.world_size > 1:
            dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        loop.log(f"quantization: calibrated on {batches} training batch(es) per rank")
        scales: dict[str, torch.Tensor] = {}
        for name, value in zip(self.names, agreed.cpu(), strict=True):
            if name not in ndims:  # never called: it stays float
                loop.log(f"quantization: layer {name!r} saw no input while calibrating: kept float")
                continue
            scale, _ = choose_qparams_affine(
                torch.stack([-value, value]), MappingType.SYMMETRIC, [2], torch.int8
            )
            scales[name] = scale.reshape([1] * ndims[name])
        return scales

    def finish(self, loop: LoopView) -> dict[str, Any]:
        parts, ctx, method = loop.parts, loop.ctx, self.settings.method
        model = float_copy(parts.model)
        float_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        scales = self._calibrate(model, loop) if method == "static" else {}
        modules = dict(model.named_modules())
        done = [name for name in self.names if method == "dynamic" or name in scales]
        for name in done:
            quantize_linear(modules[name], method, scales.get(name))
        summary: dict[str, Any] = {"quantization_method": method, "quantized_layers": len(done)}
        if ctx.is_main:
            written = save_quantized_model(
                model, loop.place.output_dir / "artifacts" / ARTIFACT, method
            )
            summary.update(
                quantized_artifact=ARTIFACT,
                quantized_size_bytes=written.size_bytes,
                float_size_bytes=float_bytes,
                quantized_size_ratio=written.size_bytes / float_bytes,
            )
        if loop.val_loader is not None:
            cpu_float32 = Precision("O0", None, "cpu", config=parts.config)
            values = evaluate(
                model, loop.val_loader, CPU, cpu_float32, parts.user, reduce_device=ctx.device
            )
            last = loop.state.last_metrics
            for name, value in values.items():
                summary[f"quantized_{name}"] = value
            if "val_accuracy" in values and "val_accuracy" in last:
                summary["quantized_accuracy_delta"] = values["val_accuracy"] - last["val_accuracy"]
            if "val_loss" in last:
                summary["quantized_loss_delta"] = values["val_loss"] - last["val_loss"]
        barrier(loop.ctx)
        loop.log(
            f"quantization: {len(done)} Linear layer(s) int8 ({method}), written to artifact "
            f"{ARTIFACT}"
            + "".join(f" {k}={v}" for k, v in summary.items() if k.startswith("quantized_val"))
        )
        return summary
