""":class:`TensorBoardLogger`: TensorBoard event files, written by the run and copied home for a
remote job."""

from __future__ import annotations

import os
from typing import Any

from ace3.config.specs import TensorBoardSpec
from ace3.training.loggers.arguments import checked_path, flag
from ace3.training.loggers.base import Logger

__all__ = ["TensorBoardLogger"]


class TensorBoardLogger(Logger):
    """TensorBoard event files in ``log_dir`` (view with ``tensorboard --logdir=<log_dir>``).

    Written by rank 0 of the run: every metric as a scalar; with ``log_graph`` the model graph
    (traced once on a training batch), with ``log_images`` a grid of input images once (from
    an ``N,C,H,W`` or ``N,H,W`` batch, or flat inputs whose feature count is a perfect square,
    shown as square grayscale images), with ``log_histograms`` the weights at every epoch end.
    In-process runs write into ``log_dir`` directly; for a remote job the job writes the files
    and the SDK copies them into ``log_dir`` as they grow. Needs ``pip install
    'ace3[tensorboard]'`` where the run executes.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] = "./runs",
        log_graph: bool = False,
        log_images: bool = False,
        log_histograms: bool = False,
    ) -> None:
        owner = "TensorBoardLogger"
        self.log_dir = checked_path(owner, "log_dir", log_dir)
        self.log_graph = flag(owner, "log_graph", log_graph)
        self.log_images = flag(owner, "log_images", log_images)
        self.log_histograms = flag(owner, "log_histograms", log_histograms)

    def spec(self) -> TensorBoardSpec:
        """The engine's settings, writing into this machine's ``log_dir`` (an in-process run
        uses it as is; a remote job's SDK maps the directory to ``artifact://tensorboard``)."""
        return TensorBoardSpec(
            log_dir=str(self.log_dir.resolve()),
            log_graph=self.log_graph,
            log_images=self.log_images,
            log_histograms=self.log_histograms,
        )

    def training_fields(self) -> dict[str, Any]:
        return {"tensorboard": self.spec()}

    def artifact_dirs(self) -> dict[str, str]:
        return {"tensorboard": str(self.log_dir.resolve())}
