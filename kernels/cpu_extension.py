"""radixlm's C++ CPU kernels (``kernels/{attention,elementwise,gemm,quant,argmax,decoder}/cpu/*.cpp``), compiled on first use.

The sources are built with ``torch.utils.cpp_extension.load`` (ninja + the system C++ compiler)
into ``$RADIXLM_KERNEL_CACHE`` (default ``~/.cache/radixlm/kernels``), in a folder per torch
version, CPU capability and digest of the sources, and registered as ``torch.ops.radixlm_cpu.*``. The first build takes
~20 s on 2 cores; later processes load the library that folder holds with ``torch.ops.load_library``
(no compiler or ninja run: a changed source or flag means another digest, so another folder); the
file lock makes concurrent first builds, e.g. of several TP ranks, safe.

The vector width follows torch's own dispatch (``torch.backends.cpu.get_cpu_capability()``):
AVX-512 or AVX2 via ATen's ``at::vec`` (the ``CPU_CAPABILITY_*`` macros), else scalar code.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Iterator, Optional

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).parent / "attention" / "cpu" / "paged_attention.cpp",
           Path(__file__).parent / "elementwise" / "cpu" / "elementwise.cpp",
           Path(__file__).parent / "gemm" / "cpu" / "gemm.cpp",
           Path(__file__).parent / "gemm" / "cpu" / "swiglu.cpp",
           Path(__file__).parent / "quant" / "cpu" / "quant_gemm.cpp",
           Path(__file__).parent / "argmax" / "cpu" / "argmax.cpp",
           Path(__file__).parent / "decoder" / "cpu" / "decoder_layers.cpp"]
HEADERS = [Path(__file__).parent / "attention" / "cpu" / "amx_attention.h",
           Path(__file__).parent / "elementwise" / "cpu" / "exp2_avx512.h",
           Path(__file__).parent / "elementwise" / "cpu" / "silu_mul_avx512.h",
           Path(__file__).parent / "elementwise" / "cpu" / "bf16_rows_avx512.h",
           Path(__file__).parent / "elementwise" / "cpu" / "bf16_avx512.h",
           Path(__file__).parent / "attention" / "cpu" / "pair_tile_attention.h",
           Path(__file__).parent / "attention" / "cpu" / "dpbf16_attention.h",
           Path(__file__).parent / "gemm" / "cpu" / "microkernel.h", Path(__file__).parent / "gemm" / "cpu" / "transpose.h",
           Path(__file__).parent / "gemm" / "cpu" / "bf16_dot.h", Path(__file__).parent / "gemm" / "cpu" / "bf16_packed_avx512.h",
           Path(__file__).parent / "gemm" / "cpu" / "bf16_amx.h", Path(__file__).parent / "gemm" / "cpu" / "amx_tiles.h",
           Path(__file__).parent / "gemm" / "cpu" / "work_stealing.h",
           Path(__file__).parent / "gemm" / "cpu" / "fp32_packed_avx512.h",
           Path(__file__).parent / "quant" / "cpu" / "quant_rows_avx512.h",
           Path(__file__).parent / "quant" / "cpu" / "quant_rows_bf16_avx512.h"]  # included by SOURCES: part of the digest
OPS = ("paged_attention", "add_rms_norm_", "rope", "silu_and_mul", "pack_linear_weight", "linear_packed",
       "quant_linear", "quant_dequantize", "quant_linear_panels", "argmax_rows", "decoder_layers",
       "pack_gate_up_weight", "linear_packed_silu_mul")
_CAPABILITY_FLAGS = {
    "AVX512": ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512bw", "-mavx512vl",
               "-mavx512dq", "-mfma", "-mf16c"],
    "AVX2": ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma", "-mf16c"],
}


class CpuKernelsUnavailable(RuntimeError):
    """The C++ CPU kernels could not be built or loaded here (the message says why)."""


def _capability() -> str:
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    if cap.startswith("AVX512"):
        return "AVX512"
    return cap if cap in _CAPABILITY_FLAGS else "DEFAULT"


def _cflags(cap: str) -> list[str]:
    """-fopenmp: at::parallel_for is inline, so without it every kernel runs on one thread (the OpenMP
    calls resolve to the libgomp torch itself loads, so there is one thread pool). -ffp-contract=off:
    no fused multiply-adds the source does not ask for, so the elementwise kernels round as the torch
    ops they replace (GCC contracts even intrinsics otherwise)."""
    return ["-O3", "-fno-math-errno", "-ffp-contract=off", "-fopenmp", *_CAPABILITY_FLAGS.get(cap, [])]


def _sources_digest() -> str:
    """12 hex digits of the sources' content: checkouts with different kernel sources (two versions
    installed side by side) build into different folders instead of rebuilding one in turn."""
    digest = hashlib.sha256(" ".join(_cflags(_capability())).encode())
    for source in [*SOURCES, *HEADERS]:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def build_lock(build_dir: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``build_dir/radixlm-build.lock`` while building or loading.

    torch's own build lock is a plain file (``build_dir/lock``) that a process killed mid-build (a
    Ctrl-C during the first start) leaves behind, after which every later build waits for it forever.
    An flock is released by the kernel when its holder dies, so whoever holds ours knows no other
    radixlm process is building here: a torch lock file found then is stale and is removed (warned).
    """
    with open(build_dir / "radixlm-build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # waits while another process builds; never for a dead one
        try:
            stale = build_dir / "lock"
            if stale.exists():
                logger.warning("removing %s, left by a kernel build that was interrupted", stale)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_directory() -> Path:
    """The folder this process builds into and loads from: ``$RADIXLM_KERNEL_CACHE`` (default
    ``~/.cache/radixlm/kernels``) / ``torch<version>-<capability>-<digest of sources and flags>``;
    the library in it is ``radixlm_cpu_<capability>.so``."""
    import torch

    cache = Path(os.environ.get("RADIXLM_KERNEL_CACHE") or Path.home() / ".cache" / "radixlm" / "kernels")
    return cache / f"torch{torch.__version__.split('+')[0]}-{_capability().lower()}-{_sources_digest()}"


def _load_built(library: Path) -> bool:
    """Load ``library`` if a build left it (call under ``build_lock``); False when there is none or
    it does not load (a link cut short), so the caller builds.

    The folder's name already pins what the library was built from (torch version, CPU capability,
    digest of the sources and flags), so an existing library is the right one. Going through
    ``cpp_extension.load`` again would re-run the compiler checks and ninja on every start, and
    ninja rebuilds everything whenever ``build.ninja`` differs, e.g. when the same checkout is
    used from another virtual environment (its torch include paths differ): minutes, not a second.
    """
    import torch

    if not library.is_file():
        return False
    try:
        torch.ops.load_library(str(library))
    except OSError as e:
        logger.warning("%s does not load (%s); building it again", library, e)
        return False
    return True


@functools.lru_cache(maxsize=None)
def load_cpu_kernels() -> None:
    """Build (once per machine) and load the kernels into ``torch.ops.radixlm_cpu``.

    Raises:
        CpuKernelsUnavailable: no C++ compiler or ninja, or the build failed; the error is cached, so
            a process tries once.
    """
    import torch
    from torch.utils import cpp_extension

    cap = _capability()
    build_dir = build_directory()
    name = f"radixlm_cpu_{cap.lower()}"
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        with build_lock(build_dir):
            if not _load_built(build_dir / f"{name}.so"):
                logger.info("compiling radixlm's C++ CPU kernels into %s (first start only: 1-2 min on idle cores, "
                            "several minutes on a busy machine)", build_dir)
                cpp_extension.load(name=name, sources=[str(s) for s in SOURCES], extra_cflags=_cflags(cap),
                                   build_directory=str(build_dir), is_python_module=False, verbose=False)
    except Exception as e:  # compiler missing, ninja missing, build error
        raise CpuKernelsUnavailable(f"building radixlm's C++ CPU kernels in {build_dir} failed: {e}") from e
    missing = [op for op in OPS if not hasattr(torch.ops.radixlm_cpu, op)]
    if missing:
        raise CpuKernelsUnavailable(f"the radixlm_cpu library loaded without its ops {missing}")
    logger.info("C++ CPU kernels loaded (%s, %s)", cap, build_dir)


@functools.lru_cache(maxsize=None)
def cpu_kernels_error() -> Optional[str]:
    """None when ``load_cpu_kernels`` succeeds (building on the first call), else why it failed."""
    try:
        load_cpu_kernels()
    except CpuKernelsUnavailable as e:
        return str(e)
    return None


def cpu_or_torch_native(what: str) -> str:
    """The backend name ``auto`` means on CPU: ``"cpu"`` when the C++ kernels load here, else
    ``"torch_native"`` after a warning naming ``what`` (e.g. ``"attention"``) and the reason."""
    error = cpu_kernels_error()
    if error is None:
        return "cpu"
    logger.warning("%s: the C++ CPU kernel is unavailable (%s); using torch_native", what, error)
    return "torch_native"
