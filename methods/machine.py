"""What machine a figure was measured on: the CPU's model, the instruction sets that decide which kernels
win (AVX2, AVX-512, AVX512-BF16/FP16, AMX), cores and threads.

Machines of one size differ in kind, and a kernel choice (packed weights for oneDNN, bfloat16) that wins on
one loses on another, so every summary and figure carries ``cpu()``, engine choices are cached under
``machine_key()``, and reports refuse to divide timings taken on different kinds.
"""
from __future__ import annotations

import hashlib
import os
import platform
import re
from functools import lru_cache

import torch

# The ISA flags (as /proc/cpuinfo names them) that change which CPU kernels are fast, in rising order.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
             "amx_fp16")


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, tuple[str, ...], str]:
    """(model name, ISA flags present, family/model/stepping) from /proc/cpuinfo; elsewhere what ``platform``
    knows and no flags."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    except OSError:
        return platform.processor() or platform.machine(), (), ""

    def field(name: str) -> str:
        m = re.search(rf"^{name}\s*:\s*(.*)$", text, re.M)
        return m.group(1).strip() if m else ""

    flags = set(field("flags").split())
    ident = "/".join(field(k) for k in ("cpu family", "model", "stepping"))
    return field("model name") or platform.machine(), tuple(f for f in ISA_FLAGS if f in flags), ident


def cpu() -> dict:
    """The CPU as a figure needs it said: model, family/model/stepping (two CPUs that share a marketing name,
    like 'AMD EPYC' under a hypervisor, can be different generations), ISA flags, cores, torch's threads."""
    name, flags, ident = _cpuinfo()
    return {"model": name, "id": ident, "isa": list(flags), "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "kind": kind()}


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: a container's or a job's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def kind() -> str:
    """A short name for the machine kind: the widest vector ISA and the matrix/bf16 extensions, e.g.
    ``avx2``, ``avx512+bf16``, ``avx512+bf16+amx``."""
    flags = set(_cpuinfo()[1])
    base = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else platform.machine()
    extra = [tag for tag, flag in (("bf16", "avx512_bf16"), ("fp16", "avx512_fp16"), ("amx", "amx_bf16"))
             if flag in flags]
    return "+".join([base, *extra])


def native(dtype: torch.dtype) -> bool:
    """This CPU has matrix instructions for ``dtype`` (bf16: AVX512-BF16 or AMX; fp16: AVX512-FP16 or AMX-FP16);
    without them torch emulates it, and products of many rows cost several times float32's."""
    flags = set(_cpuinfo()[1])
    if dtype == torch.bfloat16:
        return bool(flags & {"avx512_bf16", "amx_bf16"})
    if dtype == torch.float16:
        return bool(flags & {"avx512_fp16", "amx_fp16"})
    return True


def machine_key() -> str:
    """Names a machine kind and thread count for caches of measured choices (engine.pack=auto)."""
    name, flags, ident = _cpuinfo()
    raw = f"{name}|{ident}|{','.join(flags)}|{torch.get_num_threads()}|{torch.__version__}"
    return f"{kind()}-t{torch.get_num_threads()}-{hashlib.sha256(raw.encode()).hexdigest()[:10]}"


def describe(c: dict | None) -> str:
    """One line for a figure's footer: ``AMD EPYC (25/1/1), avx2, 2 cores, 2 threads``."""
    if not c:
        return "machine not recorded"
    return (f"{c.get('model', '?')} ({c.get('id', '?')}), {c.get('kind', '?')}, {c.get('cores', '?')} cores, "
            f"{c.get('threads', '?')} threads")


class Load:
    """How busy the machine was while a block ran, from Linux's /proc (None elsewhere), as a context manager::

        with Load() as load:
            ...  # the timed work
        load.cpu_wait  # seconds this process's threads were ready to run but waited for a CPU (summed over them)
        load.others    # cores' worth of CPU time that other processes (and the hypervisor: steal) used meanwhile
        load.load_avg  # the one-minute load average at the end (a slow average: context, not evidence)

    A quiet machine gives ``cpu_wait`` near 0 whatever else runs on other cores; a busy one (more runnable threads
    than cores) makes the timed threads wait, and the wait is the share of the time not spent on the work.
    """

    cpu_wait: float | None = None
    others: float | None = None
    load_avg: float | None = None

    def __enter__(self) -> "Load":
        self._start = self._sample()
        return self

    def __exit__(self, *exc) -> None:
        end = self._sample()
        if self._start is None or end is None:
            return
        self.load_avg = os.getloadavg()[0]
        (t0, wait0, busy0, own0), (t1, wait1, busy1, own1) = self._start, end
        self.cpu_wait = max(0.0, (wait1 - wait0) / 1e9)  # a thread that ended meanwhile takes its wait along
        ticks = os.sysconf("SC_CLK_TCK")
        self.others = max(0.0, ((busy1 - busy0) - (own1 - own0)) / ticks / max(t1 - t0, 1e-9))

    @staticmethod
    def _sample() -> tuple[float, int, int, int] | None:
        """(time, run-queue wait of this process's threads in ns, busy jiffies of the machine, of this process)."""
        import time

        try:
            wait = 0
            for task in os.scandir("/proc/self/task"):
                with open(f"{task.path}/schedstat") as f:
                    wait += int(f.read().split()[1])
            with open("/proc/stat") as f:
                user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own = int(fields[11]) + int(fields[12])  # utime and stime (the 14th and 15th fields of the line)
        except (OSError, ValueError, IndexError):
            return None
        return time.perf_counter(), wait, user + nice + system + irq + softirq + steal, own
