"""The user-facing torch objects: mixed precision (:mod:`.amp`), optimizers, schedulers,
callbacks, loggers, profiling, data loading and checkpoint files. The only SDK package besides
the engine (:mod:`ace3.runtime`) that imports torch; ``ace3`` reaches these names lazily
(``ace3.optimizers``, ``ace3.callbacks``, ...) so that ``import ace3`` stays torch-free.
"""
