"""The optimizers beyond the Adam family and SGD (``TrainingConfig.optimizer``), each with the
settings named by it (:mod:`ace3.config.extra_optimizers`):

- ``lion``: ``pytorch_optimizer.Lion`` (Chen et al. 2023): ``p -= lr * sign(beta1 m + (1 -
  beta1) g)``, then ``m = beta2 m + (1 - beta2) g``; decoupled weight decay.
- ``sophia``: ``Sophia``, ``pytorch_optimizer.SophiaH`` (Liu et al. 2023) with a
  Hutchinson estimate of the Hessian diagonal (``z * (H z)`` for a Rademacher ``z``: exact for
  a diagonal Hessian) every ``sophia_update_period`` steps; ``p -= lr * clip(m / max(h, eps),
  -rho, rho)``; the
  engine runs those steps' backward passes with ``create_graph=True``
  (:func:`needs_grad_graph`).
- ``galore_adamw``: ``GaLoreAdamW``, ``pytorch_optimizer.GaLore`` (Zhao et al. 2024):
  AdamW whose every 2-D weight's gradient is projected onto ``galore_rank`` singular vectors
  (recomputed every ``galore_update_proj_gap`` steps), the update projected back and scaled
  by ``galore_scale``; other parameters get plain AdamW.
- ``adafactor``: ``torch.optim.Adafactor`` (Shazeer and Stern 2018): factored second moment
  (row and column means) for matrices.

Lion, Sophia and GaLore come from the ``pytorch-optimizer`` package, an optional extra
(``pip install 'ace3[optimizers]'``; workers install it): without it the job fails with
:class:`MissingOptimizerPackageError`, which says so.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ace3.config import TrainingConfig
from ace3.config.extra_optimizers import optimizer_setting
from ace3.errors import ACE3Error

__all__ = [
    "MissingOptimizerPackageError",
    "build_extra_optimizer",
    "graph_keeping_backward",
    "needs_grad_graph",
    "plain_backward",
]

INSTALL_HINT = (
    "needs the pytorch-optimizer package where the training runs: pip install "
    "'ace3[optimizers]' (or pip install pytorch-optimizer); workers install it with the "
    "worker extra"
)


class MissingOptimizerPackageError(ACE3Error, ImportError):
    """The optimizer a config names comes from a package that is not installed."""


def _library() -> Any:
    try:
        import pytorch_optimizer
    except ImportError as error:
        raise MissingOptimizerPackageError(
            f"optimizer lion, sophia and galore_adamw {INSTALL_HINT} ({error})"
        ) from error
    return pytorch_optimizer


def needs_grad_graph(optimizer: Any) -> bool:
    """Whether the coming step's backward passes must keep the gradient's graph
    (``create_graph=True``): a Sophia step that estimates the Hessian."""
    wants = getattr(optimizer, "needs_grad_graph", None)
    return bool(wants()) if callable(wants) else False


def plain_backward(loss: torch.Tensor) -> None:
    loss.backward()


def graph_keeping_backward(loss: torch.Tensor) -> None:
    """``backward(create_graph=True)`` (a Sophia step that estimates the Hessian), without
    torch's warning about the parameter-gradient reference cycle: the engine drops the
    gradients (``zero_grad(set_to_none=True)``) before the next step."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*create_graph=True.*", category=UserWarning)
        loss.backward(create_graph=True)


@functools.cache
def _sophia_class() -> type[torch.optim.Optimizer]:
    library = _library()

    class Sophia(library.SophiaH):  # type: ignore[name-defined]  # a class of the lazily imported library
        """``SophiaH`` that tells the engine which steps estimate the Hessian (those need the
        gradient's graph: their backward passes run with ``create_graph=True``)."""

        def needs_grad_graph(self) -> bool:
            done = int(self.param_groups[0].get("step", 0))
            return done % self.update_period == 0

    return Sophia


@functools.cache
def _galore_class() -> type[torch.optim.Optimizer]:
    library = _library()
    from pytorch_optimizer.optimizer.utils.galore import GaLoreProjector

    class GaLoreAdamW(library.GaLore):  # type: ignore[name-defined]  # a class of the lazily imported library
        """``GaLore`` whose projections are saved as tensors (checkpoints are read with
        ``torch.load(weights_only=True)``: no pickled objects) and rebuilt on load."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.register_state_dict_post_hook(_projectors_to_tensors)

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            super().load_state_dict(state_dict)
            _projectors_from_tensors(self)

    def _projectors_to_tensors(optimizer: Any, state_dict: dict[str, Any]) -> dict[str, Any]:
        packed = {}
        for key, entry in state_dict["state"].items():
            projector = entry.get("projector")
            if isinstance(projector, GaLoreProjector):
                ortho = projector.ortho_matrix
                entry = {**entry, "projector": {
                    "ortho_matrix": list(ortho) if isinstance(ortho, tuple) else ortho,
                    "full": isinstance(ortho, tuple),
                    "last_svd_step": projector.last_svd_step,
                }}  # fmt: skip
            packed[key] = entry
        return {**state_dict, "state": packed}

    def _projectors_from_tensors(optimizer: Any) -> None:
        for group in optimizer.param_groups:
            for param in group["params"]:
                entry = optimizer.state.get(param, {})
                saved = entry.get("projector")
                if not isinstance(saved, dict):
                    continue
                projector = GaLoreProjector(
                    rank=group["rank"],
                    update_proj_gap=group["update_proj_gap"],
                    scale=group["scale"],
                    projection_type=group["projection_type"],
                )
                ortho = saved["ortho_matrix"]
                projector.ortho_matrix = tuple(ortho) if saved["full"] else ortho
                projector.last_svd_step = int(saved["last_svd_step"])
                entry["projector"] = projector

    return GaLoreAdamW


def __getattr__(name: str) -> Any:
    """``Sophia`` and ``GaLoreAdamW`` are made on first use (their base classes come from the
    optional package)."""
    makers = {"Sophia": _sophia_class, "GaLoreAdamW": _galore_class}
    if name in makers:
        cls = makers[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def galore_groups(params: list[nn.Parameter], config: TrainingConfig) -> list[dict[str, Any]]:
    """GaLore's parameter groups: the 2-D weights with the projection settings, the rest
    plain."""
    matrices = [p for p in params if p.dim() == 2]
    others = [p for p in params if p.dim() != 2]
    groups: list[dict[str, Any]] = []
    if matrices:
        groups.append({
            "params": matrices,
            "rank": optimizer_setting(config, "galore_rank"),
            "update_proj_gap": optimizer_setting(config, "galore_update_proj_gap"),
            "scale": optimizer_setting(config, "galore_scale"),
            "projection_type": optimizer_setting(config, "galore_proj_type"),
        })  # fmt: skip
    if others:
        groups.append({"params": others})
    return groups


def build_extra_optimizer(
    params: Iterable[nn.Parameter], config: TrainingConfig
) -> torch.optim.Optimizer:
    """The optimizer ``config.optimizer`` names, one of lion, sophia, galore_adamw or
    adafactor, over ``params`` (the trainable ones)."""
    trainable = list(params)
    lr, wd, name = config.learning_rate, config.weight_decay, config.optimizer
    if name == "adafactor":
        return torch.optim.Adafactor(
            trainable,
            lr=lr,
            beta2_decay=float(optimizer_setting(config, "adafactor_beta2_decay")),  # type: ignore[arg-type]  # optimizer_setting returns object; the config validated the field
            eps=tuple(optimizer_setting(config, "adafactor_eps")),  # type: ignore[arg-type]  # optimizer_setting returns object; the config validated the field
            d=float(optimizer_setting(config, "adafactor_d")),  # type: ignore[arg-type]  # optimizer_setting returns object; the config validated the field
            weight_decay=wd,
        )
    if name == "lion":
        betas: tuple[float, ...] = tuple(optimizer_setting(config, "lion_betas"))  # type: ignore[arg-type]  # optimizer_setting returns object; the config validated the field
        return _library().Lion(trainable, lr=lr, betas=betas, weight_decay=wd)
    if name == "sophia":
        return _sophia_class()(
            trainable,
            lr=lr,
            betas=tuple(optimizer_setting(config, "sophia_betas")),  # type: ignore[arg-type]  # optimizer_setting returns object; the config validated the field
            weight_decay=wd,
            p=float(optimizer_setting(config, "sophia_rho")),  # type: ignore[arg-type]  # optimizer_setting returns object; the config validated the field
            update_period=int(optimizer_setting(config, "sophia_update_period")),  # type: ignore[call-overload]  # optimizer_setting returns object; the config validated the field
            hessian_distribution="rademacher",
        )
    if name == "galore_adamw":
        return _galore_class()(
            galore_groups(trainable, config),
            lr=lr,
            betas=tuple(config.betas),
            eps=config.eps,
            weight_decay=wd,
        )
    raise ValueError(f"{name!r} is not one of lion, sophia, galore_adamw, adafactor")
