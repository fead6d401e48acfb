"""ACE3: train PyTorch models on a self-hosted training service.

::

    import ace3

    client = ace3.Client()                      # ACE3_API_KEY, ACE3_BASE_URL
    model = client.load_model("model.py")       # defines build_model(**kwargs) -> nn.Module
    dataset = client.load_dataset("digits.npz")
    trainer = ace3.Trainer(ace3.TrainingConfig(epochs=3, batch_size=64))
    result = trainer.train(model, dataset)
    print(result.best_val_accuracy)

    hp_config = ace3.HPConfig(search_space={"learning_rate": ace3.hp.loguniform(1e-5, 1e-2)})
    best_params = ace3.hyperparameter_search(model, dataset, hp_config)

Importing ``ace3`` needs only httpx, pydantic and rich (never torch). The training-side names
(``ace3.autocast``, ``ace3.training.optimizers``, ``ace3.DataLoader``, ...) load on first use.
"""

from __future__ import annotations

from typing import Any

from ace3 import _aliases, hp, utils, webhooks
from ace3._version import __version__ as SDK_VERSION
from ace3.client import (
    Client,
    DatasetRef,
    ModelRef,
    get_default_client,
    set_default_client,
)
from ace3.client.pagination import CursorPage
from ace3.client.searches import Search, SearchEvent, SearchState, SearchTrial, TrialState
from ace3.client.types import (
    Checkpoint,
    Dataset,
    Job,
    JobEvent,
    JobRecord,
    JobState,
    LogLine,
    Metric,
    Model,
)
from ace3.config import (
    AMPConfig,
    CheckpointConfig,
    ConfigProblem,
    DistillationConfig,
    DistributedConfig,
    DynamicBatchSizeConfig,
    InstabilityConfig,
    LoRAConfig,
    PruningConfig,
    QuantizationConfig,
    TrainingConfig,
    unsupported_settings,
)
from ace3.errors import (
    ACE3Error,
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ChecksumMismatchError,
    ConflictError,
    InstabilityError,
    InternalServerError,
    JobCancelledError,
    JobFailedError,
    NonFiniteLossError,
    NotFoundError,
    PackingError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    SearchCancelledError,
    SearchFailedError,
    StepOutOfMemoryError,
    TrainingPreemptedError,
    UnmetRequirementsError,
    UnsafeCheckpointError,
    UnsupportedFeatureError,
    ValidationError,
    WebhookSignatureError,
)
from ace3.follow.job_handle import JobHandle, TrainingResult
from ace3.follow.search_handle import BestParams, SearchHandle, SearchResult
from ace3.hp import HPConfig
from ace3.trainers import (
    DataParallelTrainer,
    DistributedTrainer,
    ModelParallelTrainer,
    PipelineParallelTrainer,
    Trainer,
)
from ace3.trainers.hyperparameter_search import hyperparameter_search

__version__ = SDK_VERSION

_aliases.install()  # import ace3.callbacks, ace3.optimizers, ... (earlier releases' paths)

__all__ = [
    "ACE3Error",
    "AMPConfig",
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "BestParams",
    "Checkpoint",
    "CheckpointConfig",
    "ChecksumMismatchError",
    "Client",
    "ConfigProblem",
    "ConflictError",
    "CursorPage",
    "DataParallelTrainer",
    "Dataset",
    "DatasetRef",
    "DistillationConfig",
    "DistributedConfig",
    "DistributedTrainer",
    "DynamicBatchSizeConfig",
    "HPConfig",
    "InstabilityConfig",
    "InstabilityError",
    "InternalServerError",
    "Job",
    "JobCancelledError",
    "JobEvent",
    "JobFailedError",
    "JobHandle",
    "JobRecord",
    "JobState",
    "LoRAConfig",
    "LogLine",
    "Metric",
    "Model",
    "ModelParallelTrainer",
    "ModelRef",
    "NonFiniteLossError",
    "NotFoundError",
    "PackingError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "PipelineParallelTrainer",
    "PruningConfig",
    "QuantizationConfig",
    "RateLimitError",
    "Search",
    "SearchCancelledError",
    "SearchEvent",
    "SearchFailedError",
    "SearchHandle",
    "SearchResult",
    "SearchState",
    "SearchTrial",
    "StepOutOfMemoryError",
    "Trainer",
    "TrainingConfig",
    "TrainingPreemptedError",
    "TrainingResult",
    "TrialState",
    "UnmetRequirementsError",
    "UnsafeCheckpointError",
    "UnsupportedFeatureError",
    "ValidationError",
    "WebhookSignatureError",
    "__version__",
    "get_default_client",
    "hp",
    "hyperparameter_search",
    "set_default_client",
    "unsupported_settings",
    "utils",
    "webhooks",
]

# Names resolved on first use (module, attribute; None = the module itself), so that
# ``import ace3`` never imports torch.
_LAZY: dict[str, tuple[str, str | None]] = {
    "autocast": ("ace3.training.amp.autocasting", "autocast"),
    "GradientScaler": ("ace3.training.amp.scalers", "GradientScaler"),
    "DynamicLossScaler": ("ace3.training.amp.scalers", "DynamicLossScaler"),
    "StaticLossScaler": ("ace3.training.amp.scalers", "StaticLossScaler"),
    "Callback": ("ace3.training.callbacks.base", "Callback"),
    "amp": ("ace3.training.amp", None),
    "callbacks": ("ace3.training.callbacks", None),
    "data": ("ace3.training.data", None),
    "loggers": ("ace3.training.loggers", None),
    "profiling": ("ace3.training.profiling", None),
    "optimizers": ("ace3.training.optimizers", None),
    "schedulers": ("ace3.training.schedulers", None),
    "TrainingLogger": ("ace3.training.loggers.training_logger", "TrainingLogger"),
    "TensorBoardLogger": ("ace3.training.loggers.tensorboard_logger", "TensorBoardLogger"),
    "WandBLogger": ("ace3.training.loggers.wandb_logger", "WandBLogger"),
    "MLflowLogger": ("ace3.training.loggers.mlflow_logger", "MLflowLogger"),
    "save_checkpoint": ("ace3.training.checkpoints", "save_checkpoint"),
    "load_checkpoint": ("ace3.training.checkpoints", "load_checkpoint"),
    "load_quantized_model": ("ace3.training.quantized", "load_quantized_model"),
    "TrainingProfiler": ("ace3.training.profiling", "TrainingProfiler"),
    "ProfilerActivity": ("ace3.training.profiling", "ProfilerActivity"),
    "MemoryProfiler": ("ace3.training.profiling", "MemoryProfiler"),
    "DataLoader": ("ace3.training.data", "DataLoader"),
    "DataLoaderProfiler": ("ace3.training.data", "DataLoaderProfiler"),
    "optimize_dataloader": ("ace3.training.data", "optimize_dataloader"),
}


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'ace3' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(target[0])
    value = module if target[1] is None else getattr(module, target[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
