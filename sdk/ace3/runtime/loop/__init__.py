"""The training loop and what it owns: optimizer steps, losses, metrics, validation, the
optimizer and its schedule, precision, the loop's extensions and hooks contracts."""
