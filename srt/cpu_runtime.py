"""What the CPU can do and how the scheduler process uses it: bf16 units, thread count, OpenMP waiting.

- ``cpu_info()``: the model name and the instruction-set flags that matter for inference, read from
  ``/proc/cpuinfo`` (Linux; elsewhere, torch's ``backends.cpu.get_cpu_capability()`` only).
- ``prefers_bf16(info)``: True on CPUs with AMX-BF16 or AVX512-BF16 units, where oneDNN's bf16 GEMM
  runs several times faster than fp32 (measured 948 vs 187 GFLOP/s on a 2-core Xeon with AMX). There
  ``--dtype auto`` means bfloat16; elsewhere bf16 is emulated and slower, so it means float32.
- ``openmp_env()``: the OpenMP settings children get, unless the user set ``OMP_WAIT_POLICY``:
  ``OMP_WAIT_POLICY=ACTIVE`` with ``GOMP_SPINCOUNT=10000``, a short bounded spin. A decode step is
  ~150 small parallel regions; with GNU OpenMP's default (a ~300k-iteration spin at every barrier) a
  machine whose cores are also busy made each region wait for a descheduled thread (SmolLM2 batch-1
  decode on 2 cores beside another job: 754 ms per step, 63 ms with PASSIVE), while PASSIVE (no spin)
  pays a futex wake-up per region: on a quiet 2-core AMD EPYC (Zen 5) the server's batch-1 inter-token
  latency was 19-21 ms with PASSIVE and 9.3-9.6 ms with the bounded spin (in-process: 10.6 ms);
  beside two busy processes 16-24 ms passive vs 25-42 ms spinning (docs/benchmarks.md). The spin is
  counted in iterations, whose length varies by CPU: on a 2-core Intel Xeon with AMX 3000 was too short
  (the worker slept between regions: bf16 batch-1 step 31 ms vs 22.6 with 10000, batch 64 73 vs 60 ms;
  beside two busy processes batch 1 73 vs 48-50 ms, batch 64 131-192 vs 134-202 ms), so 10000. Set
  ``OMP_WAIT_POLICY=PASSIVE`` on a machine that is always shared. It only takes effect in a process
  whose OpenMP runtime has not started yet (set before torch is imported), so the launcher sets it for
  the scheduler processes it spawns.
- ``tune_malloc()``: glibc's allocator keeps freed blocks below 32 MiB for reuse instead of returning
  them to the kernel. A decode step allocates its (batch, vocab) logits afresh (25 MB at batch 128 in
  fp32, twice: the bf16 -> fp32 copy and a row gather); glibc served each from a new mmap and freed it
  back, so every step re-faulted ~6,000 pages: on the AMX Xeon VM 42-50 ms per 25 MB copy, a third of
  a shared-prefix decode step. The scheduler process calls it at start (the process is radixlm's);
  ``Engine`` leaves the caller's process alone.
- ``cpu_threads(requested, tp_size)``: intra-op threads per scheduler rank.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

# Flags reported (the rest of /proc/cpuinfo's list is noise for inference).
RELEVANT_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "avx_vnni",
                  "amx_bf16", "amx_int8", "amx_tile")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
# GNU OpenMP spin iterations at a barrier before a thread sleeps (see openmp_env).
DEFAULT_SPINCOUNT = 10000


@dataclass(frozen=True)
class CpuInfo:
    """``model``: the CPU's marketing name ("" if unknown); ``flags``: the RELEVANT_FLAGS present;
    ``cores``: CPUs this process may run on (``sched_getaffinity``)."""

    model: str = ""
    flags: tuple[str, ...] = field(default_factory=tuple)
    cores: int = 1

    def to_json(self) -> dict:
        return {"model": self.model, "flags": list(self.flags), "cores": self.cores}


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """(model name, all flags) of the first processor in a ``/proc/cpuinfo`` text."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=4)
def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> CpuInfo:
    """This machine's CPU model and relevant flags, read once per process (never raises)."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            model, flags = parse_cpuinfo(f.read())
    except OSError:
        model, flags = "", set()
    if not flags:
        try:
            import torch

            cap = torch.backends.cpu.get_cpu_capability().lower()  # "AVX512", "AVX2", "DEFAULT"...
            flags = {"avx512f", "avx2"} if cap.startswith("avx512") else ({"avx2"} if cap == "avx2" else set())
        except Exception:  # noqa: BLE001 - best effort
            flags = set()
    return CpuInfo(model, tuple(f for f in RELEVANT_FLAGS if f in flags), available_cores())


def prefers_bf16(info: CpuInfo) -> bool:
    """Whether bf16 GEMMs run natively (AMX-BF16 or AVX512-BF16)."""
    return any(f in info.flags for f in BF16_FLAGS)


def openmp_env(environ: Optional[dict[str, str]] = None) -> dict[str, str]:
    """Variables to add to a child's environment: ``OMP_WAIT_POLICY=ACTIVE`` and ``GOMP_SPINCOUNT=10000``
    (a short bounded spin) unless the user set ``OMP_WAIT_POLICY``; a user's ``GOMP_SPINCOUNT`` is kept."""
    environ = os.environ if environ is None else environ
    if environ.get("OMP_WAIT_POLICY"):
        return {}
    return {"OMP_WAIT_POLICY": "ACTIVE", **({} if environ.get("GOMP_SPINCOUNT") else {"GOMP_SPINCOUNT": str(DEFAULT_SPINCOUNT)})}


# glibc mallopt parameters (malloc.h) and the values tune_malloc sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20   # glibc's largest: blocks below it come from the heap and are reused
TRIM_THRESHOLD = 1 << 30    # free heap kept before trimming it back to the kernel


def tune_malloc(environ: Optional[dict[str, str]] = None) -> bool:
    """Set glibc's ``M_MMAP_THRESHOLD`` to 32 MiB and ``M_TRIM_THRESHOLD`` to 1 GiB in this process
    (``mallopt``), unless the user set ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` or a
    malloc ``GLIBC_TUNABLES``. Returns whether they were set (False off glibc Linux)."""
    environ = os.environ if environ is None else environ
    if ("MALLOC_MMAP_THRESHOLD_" in environ or "MALLOC_TRIM_THRESHOLD_" in environ
            or "glibc.malloc" in environ.get("GLIBC_TUNABLES", "")):
        return False
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc
        return False
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def cpu_threads(requested: Optional[int], tp_size: int, environ: Optional[dict[str, str]] = None,
                cores: Optional[int] = None) -> int:
    """Intra-op threads of one scheduler rank: ``--cpu-threads`` if given, else ``OMP_NUM_THREADS``,
    else the cores this process may use split evenly between the TP ranks (at least 1). The range of
    ``requested`` is checked by ``ServerArgs``."""
    environ = os.environ if environ is None else environ
    if requested is not None:
        return requested
    env = (environ.get("OMP_NUM_THREADS") or "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return max(1, (cores if cores is not None else available_cores()) // max(tp_size, 1))
