"""The job sandbox: a stranger's model code runs where it cannot reach the service.

:mod:`.plan` decides how this worker isolates jobs (``ACE3_SANDBOX``) and checks it at start;
:mod:`.identity` leases each running job a uid of its own; :mod:`.bubblewrap` builds the
namespaced view of the filesystem; :mod:`.seccomp` the syscall filter; :mod:`.limits` the
rlimits; :mod:`.launch` starts torchrun inside and stops it. docs/security.md has the threat
model.
"""
