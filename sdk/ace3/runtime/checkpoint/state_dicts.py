"""The state a strategy owns, in the forms the plain and sharded formats read and write.

:class:`StateDicts` is what a replicated or sharded strategy hands its checkpoint format
(:mod:`ace3.runtime.checkpoint.format`): its model and optimizer state as a plain checkpoint
holds it (full tensors, the optimizer's parameters by position) and as a sharded (DCP) one
does (torch's distributed layout ``{"model": {fqn: tensor}, "optimizer": {"state": {fqn:
{...}}, "param_groups": [...]}}``, each rank its own share). The format does the files; the
strategy says only how its objects give and take their state.

:class:`DistributedStateDicts` is torch's own ``torch.distributed.checkpoint.state_dict`` view,
right for any module and optimizer torch knows (FSDP2's sharded ones, DDP's replicated ones);
the strategies' own are in :mod:`ace3.runtime.parallel.state_dicts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ace3.runtime.checkpoint.format import TrainingParts


class StateDicts(Protocol):
    """How a strategy's model and optimizer give and take their checkpointed state."""

    def sharded(self, parts: TrainingParts, with_optimizer: bool, for_load: bool) -> dict[str, Any]:
        """This rank's share in torch's distributed layout (what DCP saves; with ``for_load``
        a template DCP loads into, the optimizer's state tensors created if need be)."""
        ...

    def load_sharded(
        self, parts: TrainingParts, state: dict[str, Any], with_optimizer: bool
    ) -> None:
        """Apply what DCP loaded into a :meth:`sharded` template."""
        ...

    def load_full(
        self, parts: TrainingParts, model: dict[str, Any], optimizer: dict[str, Any] | None
    ) -> None:
        """A plain checkpoint's full model state dict and optimizer state dict (parameters by
        position; None: none saved). A collective where the state is sharded."""
        ...

    def full_weights(self, parts: TrainingParts) -> dict[str, Any]:
        """The whole model's weights as plain tensors, full precision, on rank 0 (other ranks
        may get an empty dict). A collective where the state is sharded."""
        ...


class DistributedStateDicts:
    """torch's distributed state dict (``get_state_dict`` / ``set_state_dict``): re-shards on
    load; full (unsharded) state dicts go in with ``full_state_dict=True``."""

    def sharded(self, parts: TrainingParts, with_optimizer: bool, for_load: bool) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if not with_optimizer:
            return {"model": get_model_state_dict(parts.model)}
        model_state, optimizer_state = get_state_dict(parts.model, parts.optimizer)
        return {"model": model_state, "optimizer": optimizer_state}

    def load_sharded(
        self, parts: TrainingParts, state: dict[str, Any], with_optimizer: bool
    ) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if not with_optimizer:
            set_model_state_dict(parts.model, state["model"])
            return
        set_state_dict(
            parts.model,
            parts.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
        )

    def load_full(
        self, parts: TrainingParts, model: dict[str, Any], optimizer: dict[str, Any] | None
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        if optimizer:
            names = [name for name, p in parts.model.named_parameters() if p.requires_grad]
            set_state_dict(
                parts.model,
                parts.optimizer,
                model_state_dict=model,
                optim_state_dict=by_name(optimizer, names),
                options=options,
            )
        else:
            set_model_state_dict(parts.model, model, options=options)

    def full_weights(self, parts: TrainingParts) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # cpu_offload=True gathers onto rank 0 only (and into CPU memory).
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(parts.model, options=options)
        return {key: value.detach().cpu() for key, value in state.items()}


def by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A plain optimizer state dict (parameters by position) keyed by parameter name."""
    return {
        "state": {names[int(index)]: value for index, value in state["state"].items()},
        "param_groups": [
            {**group, "params": [names[int(index)] for index in group["params"]]}
            for group in state["param_groups"]
        ],
    }
