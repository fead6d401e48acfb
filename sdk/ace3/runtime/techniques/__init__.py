"""Fine-tuning and compression techniques: frozen parameters, initial weights, LoRA adapters,
distillation, gradient checkpointing, pruning and quantization."""
