"""The torch-free wire contract: the training configuration the SDK sends, the API validates
and the engine reads back (:mod:`.training`, :mod:`.sections`), what a job cannot run with
(:mod:`.unsupported`), its parallel layout (:mod:`.layout`), the typed events a job writes
(:mod:`.events`) and the specs that carry schedules, callbacks and profilers to a job.

Nothing in this package imports torch or the engine (import-linter checks it).
"""

from ace3.config.batch_growth import DynamicBatchSizeConfig
from ace3.config.compression import PruningConfig, QuantizationConfig
from ace3.config.distillation import DistillationConfig
from ace3.config.instability import InstabilityConfig
from ace3.config.layout import (
    parallel_degrees,
    pipeline_layout,
    runs_pipeline,
    runs_tensor_parallel,
)
from ace3.config.lora import LoRAConfig
from ace3.config.sections import AMPConfig, CheckpointConfig, DistributedConfig
from ace3.config.training import TrainingConfig
from ace3.config.unsupported import ConfigProblem, unsupported_settings

__all__ = [
    "AMPConfig",
    "CheckpointConfig",
    "ConfigProblem",
    "DistillationConfig",
    "DistributedConfig",
    "DynamicBatchSizeConfig",
    "InstabilityConfig",
    "LoRAConfig",
    "PruningConfig",
    "QuantizationConfig",
    "TrainingConfig",
    "parallel_degrees",
    "pipeline_layout",
    "runs_pipeline",
    "runs_tensor_parallel",
    "unsupported_settings",
]
