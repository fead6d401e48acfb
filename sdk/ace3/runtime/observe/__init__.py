"""What a run reports and who watches it: the event log, hooks for callbacks, loggers,
profilers and TensorBoard, peak memory."""
