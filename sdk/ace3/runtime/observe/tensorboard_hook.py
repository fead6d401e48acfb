"""TensorBoard event files for a run, written by rank 0 (``torch.utils.tensorboard``).

What goes in (see :class:`ace3.config.specs.TensorBoardSpec`):

- every metrics event, each value a scalar under its own name (``train_loss``, ``val_loss``,
  ``learning_rate``, ...), at the run's optimizer step;
- ``log_graph``: the model graph once, traced on the example training batch in eval mode with
  the RNG state put back afterwards (so the run trains exactly as without it); a model that
  cannot be traced gives a warning and no graph;
- ``log_images``: up to 16 input images once, from the example batch: ``N,C,H,W`` with C 1 or 3,
  ``N,H,W``, or flat floating-point inputs whose feature count is a perfect square (the 64
  pixels of scikit-learn's digits become 8x8 grayscale images); scaled to [0, 1];
- ``log_histograms``: every parameter's values at each epoch end (tag ``weights/<name>``).

Files are flushed after each event so a remote job's copies stay current.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import torch

from ace3.config.specs import TensorBoardSpec
from ace3.runtime.loop.hooks import RunContext, TrainingHook
from ace3.training.loggers.base import LoggerUnavailableError

MAX_IMAGES = 16
_INPUT_KEYS = ("inputs", "input", "x", "pixel_values", "images", "input_ids")


def summary_writer_class() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or a clear error when tensorboard is missing."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise LoggerUnavailableError(
            f"TensorBoard logging needs the tensorboard package, which is not installed ({exc}):"
            " run pip install 'ace3[tensorboard]' where the training runs (for a remote job, "
            "on the workers)"
        ) from None
    return SummaryWriter


def model_inputs(batch: Any) -> Any:
    """What the model is called with for this batch: the tensor, ``batch[0]`` of an
    ``(inputs, targets)`` pair, or a common input key of a dict batch; None if unclear."""
    if torch.is_tensor(batch):
        return batch
    if isinstance(batch, tuple | list) and batch and torch.is_tensor(batch[0]):
        return batch[0]
    if isinstance(batch, dict):
        for key in _INPUT_KEYS:
            if torch.is_tensor(batch.get(key)):
                return batch[key]
    return None


def image_grid(inputs: Any) -> tuple[torch.Tensor, str] | None:
    """Up to :data:`MAX_IMAGES` images ``N,C,H,W`` in [0, 1] from an input tensor, with how they
    were read; None when the tensor does not look like images."""
    if not torch.is_tensor(inputs):
        return None
    x = inputs.detach()
    if not (x.is_floating_point() or x.dtype == torch.uint8):
        return None
    shape = tuple(x.shape)
    if x.dim() == 4 and shape[1] in (1, 3):
        how = "N,C,H,W images"
    elif x.dim() == 3 and shape[1] > 1 and shape[2] > 1:
        x, how = x.unsqueeze(1), "N,H,W grayscale images"
    elif x.dim() == 2 and x.is_floating_point():
        side = math.isqrt(shape[1])
        if side < 2 or side * side != shape[1]:
            return None
        x, how = x.reshape(shape[0], 1, side, side), f"flat inputs as {side}x{side} grayscale"
    else:
        return None
    images = x[:MAX_IMAGES].float().cpu()
    if inputs.dtype == torch.uint8:
        return images / 255.0, how
    low, high = images.amin(), images.amax()
    if float(high - low) > 0:
        return (images - low) / (high - low), how
    return torch.zeros_like(images), how


class TensorBoardHook(TrainingHook):
    """Writes the run's TensorBoard event files on rank 0.

    ``log_dir``: where to write; default: ``spec.log_dir`` resolved by the run
    (``artifact://tensorboard`` -> ``output_dir/artifacts/tensorboard``).
    """

    def __init__(self, spec: TensorBoardSpec, log_dir: str | Path | None = None) -> None:
        self.spec = spec
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self._writer_class = summary_writer_class()  # fail before training, on every rank
        self.writer: Any = None
        self.step = 0

    def bind(self, run: RunContext) -> None:
        super().bind(run)
        if self.log_dir is None:
            self.log_dir = run.resolve_path(self.spec.log_dir)

    def on_train_begin(self) -> None:
        if not self.run.is_main:
            return
        assert self.log_dir is not None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.writer = self._writer_class(log_dir=str(self.log_dir), flush_secs=10)
        inputs = model_inputs(self.run.example_batch)
        if self.spec.log_graph:
            self._log_graph(inputs)
        if self.spec.log_images:
            self._log_images(inputs)
        self.writer.flush()

    def _log_graph(self, inputs: Any) -> None:
        if inputs is None:
            warnings.warn(
                "TensorBoard log_graph: no tensor input found in the example batch; graph skipped",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        model = self.run.model
        modes = {module: module.training for module in model.modules()}
        devices = [self.run.device] if self.run.device.type == "cuda" else []
        try:
            model.eval()
            with torch.random.fork_rng(devices=devices), torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.writer.add_graph(model, inputs)
        except Exception as exc:
            warnings.warn(
                f"TensorBoard log_graph: the model could not be traced ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); graph skipped, training goes on",
                RuntimeWarning,
                stacklevel=2,
            )
        finally:
            for module, training in modes.items():
                module.training = training

    def _log_images(self, inputs: Any) -> None:
        grid = image_grid(inputs)
        if grid is None:
            shape = tuple(inputs.shape) if torch.is_tensor(inputs) else type(inputs).__name__
            warnings.warn(
                f"TensorBoard log_images: the example batch's inputs ({shape}) are not "
                "image-shaped (N,C,H,W with C 1 or 3, N,H,W, or flat with a square feature "
                "count); images skipped",
                RuntimeWarning,
                stacklevel=2,
            )
            return
        images, how = grid
        try:
            self.writer.add_images("inputs", images, global_step=0, dataformats="NCHW")
            self.writer.add_text("inputs/description", f"first training batch: {how}", 0)
        except Exception as exc:
            warnings.warn(
                f"TensorBoard log_images failed ({type(exc).__name__}: {exc}); images skipped",
                RuntimeWarning,
                stacklevel=2,
            )

    def on_metrics(self, step: int, epoch: int, values: dict[str, float]) -> None:
        self.step = step
        if self.writer is None:
            return
        for name, value in values.items():
            if value is not None:
                self.writer.add_scalar(name, float(value), global_step=step)
        self.writer.flush()

    def on_epoch_end(self, epoch: int, logs: dict[str, float]) -> None:
        if self.writer is None or not self.spec.log_histograms:
            return
        for name, parameter in self.run.model.named_parameters():
            values = parameter.detach().float().cpu()
            if values.numel() == 0 or not bool(torch.isfinite(values).all()):
                continue
            self.writer.add_histogram(f"weights/{name}", values, global_step=self.step)
        self.writer.flush()

    def on_train_end(self, logs: dict[str, float]) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
