"""The seccomp filter of a sandboxed job: no new user namespaces, no kernel keyrings, no eBPF.

A job's processes may not create user namespaces (the usual first step of a kernel exploit, and
a way to become "root" over mounts of its own), use the kernel keyrings (per uid, so they would
outlive the job and meet the next job of the same uid), load eBPF programs, or use
``userfaultfd`` and ``io_uring``. ``clone3`` answers ENOSYS, so the C library falls back to
``clone``, whose flags the filter can read (the same choice as Docker's default profile).
Anything else is allowed. A syscall of another ABI (32-bit, x32) is refused.

The program is classic BPF as bubblewrap's ``--seccomp FD`` reads it: an array of
``struct sock_filter``, in the machine's byte order.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6]
_NR_OFFSET = 0
_ARCH_OFFSET = 4
_ARG0_LOW_OFFSET = 16  # the low 32 bits of args[0] (little-endian machines only)

_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JSET_K = 0x45
_JGE_K = 0x35
_RET_K = 0x06

_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000

CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000


@dataclass(frozen=True)
class _Arch:
    audit_arch: int
    clone: int
    clone3: int
    unshare: int
    refused: tuple[int, ...]  # keyctl, add_key, request_key, bpf, userfaultfd, io_uring x3
    has_x32: bool


_ARCHES = {
    "x86_64": _Arch(
        audit_arch=0xC000003E,
        clone=56,
        clone3=435,
        unshare=272,
        refused=(250, 248, 249, 321, 323, 425, 426, 427),
        has_x32=True,
    ),
    "aarch64": _Arch(
        audit_arch=0xC00000B7,
        clone=220,
        clone3=435,
        unshare=97,
        refused=(219, 217, 218, 280, 282, 425, 426, 427),
        has_x32=False,
    ),
}


class UnsupportedArchitectureError(RuntimeError):
    pass


# One instruction before assembly: a load or return (no targets), or a conditional jump to
# labelled instructions ("next" falls through).
_Step = tuple[int, int, str, str]


def _assemble(steps: list[_Step], labels: dict[str, int]) -> bytes:
    out = []
    for position, (code, k, if_true, if_false) in enumerate(steps):
        offsets = [
            0 if target == "next" else labels[target] - position - 1
            for target in (if_true, if_false)
        ]
        if any(not 0 <= offset <= 255 for offset in offsets):
            raise ValueError("seccomp jump out of range")
        out.append(struct.pack("=HBBI", code, offsets[0], offsets[1], k))
    return b"".join(out)


def filter_program(machine: str | None = None) -> bytes:
    """The compiled filter for this machine's architecture (x86_64 or aarch64)."""
    name = machine or platform.machine()
    arch = _ARCHES.get(name)
    if arch is None:
        raise UnsupportedArchitectureError(
            f"no seccomp filter for {name}: run workers with ACE3_SANDBOX=uid on this architecture"
        )
    steps: list[_Step] = [
        (_LD_W_ABS, _ARCH_OFFSET, "", ""),
        (_JEQ_K, arch.audit_arch, "next", "eperm"),
        (_LD_W_ABS, _NR_OFFSET, "", ""),
    ]
    if arch.has_x32:
        steps.append((_JGE_K, _X32_SYSCALL_BIT, "eperm", "next"))
    steps += [
        (_JEQ_K, arch.clone3, "enosys", "next"),
        (_JEQ_K, arch.clone, "flags", "next"),
        (_JEQ_K, arch.unshare, "flags", "next"),
    ]
    steps += [(_JEQ_K, number, "eperm", "next") for number in arch.refused]
    steps.append((_RET_K, _RET_ALLOW, "", ""))
    labels = {"flags": len(steps)}
    steps += [
        (_LD_W_ABS, _ARG0_LOW_OFFSET, "", ""),
        (_JSET_K, CLONE_NEWUSER, "eperm", "next"),
        (_RET_K, _RET_ALLOW, "", ""),
    ]
    labels["eperm"] = len(steps)
    steps.append((_RET_K, _RET_ERRNO | errno.EPERM, "", ""))
    labels["enosys"] = len(steps)
    steps.append((_RET_K, _RET_ERRNO | errno.ENOSYS, "", ""))
    return _assemble([(code, k, t or "next", f or "next") for code, k, t, f in steps], labels)
