"""The rank's process: the process group, torchrun and the warm launcher, parent death,
the rank prefix of its output."""
