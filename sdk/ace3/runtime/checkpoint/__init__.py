"""Checkpoints: the formats a strategy names (format: the contract; plain, gathered and
sharded (DCP), made by formats.format_for over the state the strategy supplies, state_dicts),
file names, atomic writes and safe loads (files), and the writer every rank calls at a save."""
