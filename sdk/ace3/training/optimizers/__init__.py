"""Memory-saving Adam optimizers: ``ace3.training.optimizers`` (imports torch; ``import ace3`` does not).

Both are real :class:`torch.optim.Optimizer` subclasses with Adam's update and *decoupled*
(AdamW-style) weight decay, ``p <- p * (1 - lr * weight_decay)`` before the Adam step. They
differ from ``torch.optim.Adam`` only in how they store the two moments between steps:

- :class:`MemoryEfficientAdam`: first moment in bfloat16, second moment factored into row and
  column statistics (Adafactor) for matrices; about a quarter of Adam's state for big layers.
- :class:`Adam8bit`: both moments as uint8 codes with blockwise float32 scales (Dettmers et
  al.); about a quarter of Adam's state. On CUDA with ``bitsandbytes`` installed it hands the
  work to ``bitsandbytes.optim.Adam8bit``.

Each step reads the stored state, computes the update in float32, and writes the state back;
``state_dict()``/``load_state_dict()`` round-trip exactly (a resumed run continues bit for bit).

:func:`optimizer_state_bytes` measures what an optimizer keeps; :func:`optimizer_settings`
turns a client-built optimizer into the ``TrainingConfig`` fields that rebuild it in a job.

The package: :mod:`.adam_base` (what both share), :mod:`.memory_efficient_adam`,
:mod:`.adam8bit` and its quantization (:mod:`.blockwise_8bit`), :mod:`.state_bytes`.
"""

from ace3.config.optimizer_settings import optimizer_settings
from ace3.training.optimizers.adam8bit import Adam8bit
from ace3.training.optimizers.memory_efficient_adam import MemoryEfficientAdam
from ace3.training.optimizers.state_bytes import optimizer_state_bytes

__all__ = ["Adam8bit", "MemoryEfficientAdam", "optimizer_settings", "optimizer_state_bytes"]
