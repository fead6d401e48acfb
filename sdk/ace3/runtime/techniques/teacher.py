"""The distillation teacher: built from its model file (a job) or taken from the caller (an
in-process run, copied so the caller's module is never changed), loaded with its weights,
placed on the rank's device in the job's precision, in eval mode, without gradients.

Weights files are read without executing pickled code, as ``init_from``'s are
(:func:`ace3.runtime.techniques.initial_weights.read_weights`): an ACE3 checkpoint (its ``model`` entry), a
plain state dict, a ``.safetensors`` file, or a sharded ``.dcp.tar``.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ace3.config import TrainingConfig
from ace3.runtime.job_spec import TeacherSpec
from ace3.runtime.loop.precision import Precision
from ace3.runtime.techniques.initial_weights import read_weights
from ace3.runtime.user_code import build_model, load_user_code

TEACHER_MODULE_NAME = "ace3_teacher_model"


def load_teacher_weights(teacher: nn.Module, state: dict[str, Any], origin: str) -> None:
    """``teacher.load_state_dict(state)``, strict, with an error that names what differs."""
    missing, unexpected = [], []
    own = teacher.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise ValueError(
            f"teacher checkpoint {origin} does not fit the teacher model: missing "
            f"{missing[:8]}, unexpected {unexpected[:8]} (is it the teacher's checkpoint?)"
        )
    teacher.load_state_dict(state)
    teacher.ace3_weights_origin = origin  # said in the log


def build_job_teacher(spec: TeacherSpec) -> nn.Module:
    """A job's teacher: its model file's factory, then its weights file if any."""
    user = load_user_code(spec.model, TEACHER_MODULE_NAME)
    teacher = build_model(user, spec.model.kwargs)
    if spec.checkpoint is not None:
        path = Path(spec.checkpoint)
        state = read_weights(path, spec.checkpoint_sha256, what="teacher_checkpoint")
        load_teacher_weights(teacher, state, path.name)
    return teacher


def local_teacher(config: TrainingConfig) -> nn.Module:
    """An in-process run's teacher: a copy of the caller's module, with the local weights
    file loaded when one is given."""
    settings = config.distillation
    assert settings is not None
    if settings.teacher_module is None:
        raise ValueError(
            f"distillation: teacher_model_id={settings.teacher_model_id!r} names a model "
            "stored on the service; an in-process run needs the teacher as a live "
            "torch.nn.Module (teacher=<module>)"
        )
    if settings.teacher_checkpoint_id is not None:
        raise ValueError(
            f"distillation: teacher_checkpoint_id={settings.teacher_checkpoint_id!r} names a "
            "checkpoint stored on the service; an in-process run takes a local weights file "
            "(teacher_checkpoint='teacher.pt')"
        )
    teacher = copy.deepcopy(settings.teacher_module)
    if settings.teacher_checkpoint_path is not None:
        path = Path(settings.teacher_checkpoint_path).expanduser()
        weights = read_weights(path, what="teacher_checkpoint")
        load_teacher_weights(teacher, weights, path.name)
    return teacher


def prepare_teacher(teacher: nn.Module, precision: Precision, device: torch.device) -> nn.Module:
    """On ``device``, in the job's weight dtype (O2/O3 store 16-bit weights), eval mode, no
    gradients; never wrapped by DDP."""
    teacher.to(device)
    if precision.casts_model:
        teacher.to(precision.model_dtype)
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher
