"""The optimizer classes of ``torch.optim``, by class name, with the keyword arguments each
takes besides ``params``: what ``TrainingConfig.optimizer`` accepts as a class name and what
its ``optimizer_kwargs`` may set, checked without importing torch (the API does not have it).

Generated from the installed torch (2.13); ``tests/unit/config/test_torch_optimizers.py`` keeps
it equal to ``torch.optim``'s classes and their signatures, and prints the new table when torch
changes.
"""

from __future__ import annotations

TORCH_VERSION = "2.13"

#: Class name -> its constructor's keyword arguments (``params`` excluded), in order.
TORCH_OPTIMIZERS: dict[str, tuple[str, ...]] = {
    "ASGD": ("lr", "lambd", "alpha", "t0", "weight_decay", "foreach", "maximize", "differentiable", "capturable"),
    "Adadelta": ("lr", "rho", "eps", "weight_decay", "foreach", "capturable", "maximize", "differentiable"),
    "Adafactor": ("lr", "beta2_decay", "eps", "d", "weight_decay", "foreach", "maximize"),
    "Adagrad": ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps", "foreach", "maximize", "differentiable", "fused"),
    "Adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "foreach", "maximize", "capturable", "differentiable", "fused", "decoupled_weight_decay"),
    "AdamW": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused"),
    "Adamax": ("lr", "betas", "eps", "weight_decay", "foreach", "maximize", "differentiable", "capturable"),
    "LBFGS": ("lr", "max_iter", "max_eval", "tolerance_grad", "tolerance_change", "history_size", "line_search_fn"),
    "Muon": ("lr", "weight_decay", "momentum", "nesterov", "ns_coefficients", "eps", "ns_steps", "adjust_lr_fn"),
    "NAdam": ("lr", "betas", "eps", "weight_decay", "momentum_decay", "decoupled_weight_decay", "foreach", "maximize", "capturable", "differentiable"),
    "RAdam": ("lr", "betas", "eps", "weight_decay", "decoupled_weight_decay", "foreach", "maximize", "capturable", "differentiable"),
    "RMSprop": ("lr", "alpha", "eps", "weight_decay", "momentum", "centered", "capturable", "foreach", "maximize", "differentiable"),
    "Rprop": ("lr", "etas", "step_sizes", "capturable", "foreach", "maximize", "differentiable"),
    "SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "foreach", "differentiable", "fused"),
    "SparseAdam": ("lr", "betas", "eps", "maximize"),
}  # fmt: skip
