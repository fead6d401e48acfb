"""Checkpoints: file names, atomic writes and safe loads (files), the plain, gathered and
sharded (DCP) formats, and the writer every rank calls at a save."""
