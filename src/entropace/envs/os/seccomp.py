"""The seccomp filter of the ``os`` sandbox: no memory outside the sandbox's caps.

Every file a sandboxed command writes lives on a size-capped tmpfs (``/work``, ``/tmp`` and
``/dev/shm``, ...), and every process's own memory is capped by ``RLIMIT_AS``. Three system
calls make memory that escapes both: ``memfd_create`` (an anonymous tmpfs file on the kernel's
internal, uncapped shm mount: 128 of 8 MiB held by one process added 1 GiB of host ``Shmem``),
``shmget`` (a System V segment, which outlives the process that filled it; the sandbox's own
IPC namespace starts with the kernel's default limits, which are effectively unlimited) and
``memfd_secret``. This module builds a classic-BPF seccomp program, passed to bwrap with
``--seccomp FD``, that makes them fail with ``EPERM``, and denies every system call of another
ABI (32-bit x86, x32), where the same calls have other numbers. bash and the standard tools
never use them; POSIX shared memory (``shm_open``) still works, on the capped ``/dev/shm``.

The program is written out by hand (``struct sock_filter``: ``u16 code, u8 jt, u8 jf, u32 k``)
so no libseccomp is needed; :func:`filter_program` returns None on an architecture whose
numbers are not listed here (then the sandbox runs without the filter and warns).
"""

from __future__ import annotations

import errno
import platform
import struct

__all__ = ["BLOCKED", "filter_program"]

# BPF instruction classes and fields (linux/bpf_common.h, linux/seccomp.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: A = seccomp_data[k]
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data
_X32_BIT = 0x40000000

#: Blocked system calls by machine: (audit arch, {name: number}).
BLOCKED: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {"memfd_create": 319, "shmget": 29, "memfd_secret": 447}),
    "aarch64": (0xC00000B7, {"memfd_create": 279, "shmget": 194, "memfd_secret": 447}),
}
_ALIASES = {"amd64": "x86_64", "arm64": "aarch64"}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes | None:
    """The seccomp program for ``machine`` (default: this one), or None if unsupported.

    Layout (jump offsets count from the next instruction; D is the last one, "deny")::

        0      A = arch;  if A != ARCH goto D
        2      A = nr
        3..    (x86_64) if A >= X32_BIT goto D;  for each blocked number: if A == nr goto D
        D - 1  return ALLOW
        D      return ERRNO(EPERM)
    """
    name = (machine or platform.machine()).lower()
    name = _ALIASES.get(name, name)
    if name not in BLOCKED:
        return None
    arch, numbers = BLOCKED[name]
    checks = [(_JEQ_K, nr) for nr in sorted(numbers.values())]
    if name == "x86_64":
        checks.insert(0, (_JGE_K, _X32_BIT))
    n = len(checks)
    out = [
        _insn(_LD_W_ABS, 0, 0, _ARCH),
        _insn(_JEQ_K, 0, n + 2, arch),
        _insn(_LD_W_ABS, 0, 0, _NR),
    ]
    out += [_insn(code, n - i, 0, k) for i, (code, k) in enumerate(checks)]
    out += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    return b"".join(out)
