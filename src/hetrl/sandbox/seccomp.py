"""A seccomp deny-list for sandboxed programs, compiled to classic BPF without libseccomp.

bubblewrap (``--seccomp FD``) installs the filter on the program after it has built the
namespaces, so the filter only needs to stop what namespaces do not: debugging other processes
(ptrace, process_vm_*), kernel attack surface the program has no business touching (bpf,
perf_event_open, io_uring, userfaultfd, keyctl, module loading, kexec) and re-shaping its own
jail (mount family, unshare/setns, pivot_root). Denied calls fail with EPERM rather than killing
the process, so an honest program that probes them keeps running. A syscall made through another
ABI (i386 on x86_64, x32) is refused, since the numbers below would not match it.

Supported architectures: x86_64 and aarch64; elsewhere ``build_filter`` returns None and the
isolation report says seccomp is unavailable.
"""

from __future__ import annotations

import platform
import struct

# Syscalls denied with EPERM, by architecture (numbers from the kernel's syscall tables).
_DENY_NAMES = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
    "sethostname",
    "setdomainname",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "add_key",
    "request_key",
    "keyctl",
    "unshare",
    "setns",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "open_by_handle_at",
    "name_to_handle_at",
    "acct",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
)
_X86_64 = dict(
    zip(
        _DENY_NAMES,
        (
            101,
            310,
            311,
            165,
            166,
            155,
            167,
            168,
            169,
            170,
            171,
            175,
            313,
            176,
            246,
            320,
            248,
            249,
            250,
            272,
            308,
            298,
            321,
            323,
            304,
            303,
            163,
            425,
            426,
            427,
            428,
            429,
            430,
            431,
            432,
            433,
            442,
        ),
    )
)
_AARCH64 = dict(
    zip(
        _DENY_NAMES,
        (
            117,
            270,
            271,
            40,
            39,
            41,
            224,
            225,
            142,
            161,
            162,
            105,
            273,
            106,
            104,
            294,
            217,
            218,
            219,
            97,
            268,
            241,
            280,
            282,
            265,
            264,
            89,
            425,
            426,
            427,
            428,
            429,
            430,
            431,
            432,
            433,
            442,
        ),
    )
)
# machine -> (AUDIT_ARCH_* value, syscall table)
_ARCHES = {"x86_64": (0xC000003E, _X86_64), "aarch64": (0xC00000B7, _AARCH64)}

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_EPERM = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
_X32_SYSCALL_BIT = 0x40000000
# offsets in struct seccomp_data
_OFF_NR, _OFF_ARCH = 0, 4


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def supported_arch(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in _ARCHES


def build_filter(machine: str | None = None) -> bytes | None:
    """The BPF program (``struct sock_filter[]`` bytes) for ``machine``; None if unsupported."""
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        return None
    audit_arch, table = _ARCHES[machine]
    prog = [
        _insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
        _insn(_JEQ_K, 1, 0, audit_arch),  # foreign ABI -> kill
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        prog += [_insn(_JSET_K, 0, 1, _X32_SYSCALL_BIT), _insn(_RET_K, 0, 0, _RET_EPERM)]
    for nr in sorted(table.values()):
        prog += [_insn(_JEQ_K, 0, 1, nr), _insn(_RET_K, 0, 0, _RET_EPERM)]
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    return b"".join(prog)
