"""The optimizer classes of ``torch.optim``, by class name, with the keyword arguments each
takes besides ``params`` and the JSON kind of each: what ``TrainingConfig.optimizer`` accepts as
a class name and what its ``optimizer_kwargs`` may set, checked without importing torch (the API
does not have it).

Generated from the installed torch (2.13); ``tests/unit/test_optimizer_choice.py`` keeps
it equal to ``torch.optim``'s classes and their signatures, and prints the new table when torch
changes.
"""

from __future__ import annotations

TORCH_VERSION = "2.13"

#: The JSON kinds of an argument: ``number`` (an int or a float), ``integer``, ``boolean``,
#: ``string``; ``?`` after a kind also allows null; ``(k1,k2)`` is an array of that length whose
#: items have those kinds. Read from the constructors' annotations (a tensor in a union is
#: dropped: JSON cannot carry one).
#: Class name -> {keyword argument (``params`` excluded): its JSON kind}, in order.
TORCH_OPTIMIZERS: dict[str, dict[str, str]] = {
    "ASGD": {"lr": "number", "lambd": "number", "alpha": "number", "t0": "number", "weight_decay": "number", "foreach": "boolean?", "maximize": "boolean", "differentiable": "boolean", "capturable": "boolean"},
    "Adadelta": {"lr": "number", "rho": "number", "eps": "number", "weight_decay": "number", "foreach": "boolean?", "capturable": "boolean", "maximize": "boolean", "differentiable": "boolean"},
    "Adafactor": {"lr": "number", "beta2_decay": "number", "eps": "(number?,number)", "d": "number", "weight_decay": "number", "foreach": "boolean?", "maximize": "boolean"},
    "Adagrad": {"lr": "number", "lr_decay": "number", "weight_decay": "number", "initial_accumulator_value": "number", "eps": "number", "foreach": "boolean?", "maximize": "boolean", "differentiable": "boolean", "fused": "boolean?"},
    "Adam": {"lr": "number", "betas": "(number,number)", "eps": "number", "weight_decay": "number", "amsgrad": "boolean", "foreach": "boolean?", "maximize": "boolean", "capturable": "boolean", "differentiable": "boolean", "fused": "boolean?", "decoupled_weight_decay": "boolean"},
    "AdamW": {"lr": "number", "betas": "(number,number)", "eps": "number", "weight_decay": "number", "amsgrad": "boolean", "maximize": "boolean", "foreach": "boolean?", "capturable": "boolean", "differentiable": "boolean", "fused": "boolean?"},
    "Adamax": {"lr": "number", "betas": "(number,number)", "eps": "number", "weight_decay": "number", "foreach": "boolean?", "maximize": "boolean", "differentiable": "boolean", "capturable": "boolean"},
    "LBFGS": {"lr": "number", "max_iter": "integer", "max_eval": "integer?", "tolerance_grad": "number", "tolerance_change": "number", "history_size": "integer", "line_search_fn": "string?"},
    "Muon": {"lr": "number", "weight_decay": "number", "momentum": "number", "nesterov": "boolean", "ns_coefficients": "(number,number,number)", "eps": "number", "ns_steps": "integer", "adjust_lr_fn": "string?"},
    "NAdam": {"lr": "number", "betas": "(number,number)", "eps": "number", "weight_decay": "number", "momentum_decay": "number", "decoupled_weight_decay": "boolean", "foreach": "boolean?", "maximize": "boolean", "capturable": "boolean", "differentiable": "boolean"},
    "RAdam": {"lr": "number", "betas": "(number,number)", "eps": "number", "weight_decay": "number", "decoupled_weight_decay": "boolean", "foreach": "boolean?", "maximize": "boolean", "capturable": "boolean", "differentiable": "boolean"},
    "RMSprop": {"lr": "number", "alpha": "number", "eps": "number", "weight_decay": "number", "momentum": "number", "centered": "boolean", "capturable": "boolean", "foreach": "boolean?", "maximize": "boolean", "differentiable": "boolean"},
    "Rprop": {"lr": "number", "etas": "(number,number)", "step_sizes": "(number,number)", "capturable": "boolean", "foreach": "boolean?", "maximize": "boolean", "differentiable": "boolean"},
    "SGD": {"lr": "number", "momentum": "number", "dampening": "number", "weight_decay": "number", "nesterov": "boolean", "maximize": "boolean", "foreach": "boolean?", "differentiable": "boolean", "fused": "boolean?"},
    "SparseAdam": {"lr": "number", "betas": "(number,number)", "eps": "number", "maximize": "boolean"},
}  # fmt: skip
