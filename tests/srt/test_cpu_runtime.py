"""CPU feature detection, the ``--dtype auto`` choice, thread count and OpenMP settings."""

from __future__ import annotations

import pytest
import torch

from radixlm.srt.cpu_runtime import CpuInfo, cpu_info, cpu_threads, openmp_env, parse_cpuinfo, prefers_bf16
from radixlm.srt.model_config import ModelConfig, _pick_dtype
from radixlm.srt.server_args import ServerArgs, ServerArgsError

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16 amx_tile amx_int8
processor\t: 1
model name\t: ignored
flags\t\t: fpu
"""
EPYC = "model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma f16c\n"


def test_parse_cpuinfo_reads_the_first_processor():
    model, flags = parse_cpuinfo(XEON)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert {"amx_bf16", "avx512_bf16", "avx2"} <= flags and "fpu" in flags


def test_bf16_only_with_bf16_units(tmp_path):
    xeon, epyc = tmp_path / "xeon", tmp_path / "epyc"
    xeon.write_text(XEON)
    epyc.write_text(EPYC)
    assert prefers_bf16(cpu_info(str(xeon))) and not prefers_bf16(cpu_info(str(epyc)))
    assert cpu_info(str(epyc)).flags == ("avx2", "fma", "f16c")
    assert prefers_bf16(CpuInfo(flags=("avx512_bf16",))) and not prefers_bf16(CpuInfo(flags=("avx512f",)))


def test_dtype_auto_follows_the_cpu(stories_path):
    cfg = ModelConfig.from_path(stories_path).hf_config
    assert _pick_dtype("auto", cfg, "cpu", CpuInfo(flags=("amx_bf16",))) == torch.bfloat16
    assert _pick_dtype("auto", cfg, "cpu", CpuInfo(flags=("avx2",))) == torch.float32
    assert _pick_dtype("float32", cfg, "cpu", CpuInfo(flags=("amx_bf16",))) == torch.float32
    here = torch.bfloat16 if prefers_bf16(cpu_info()) else torch.float32
    assert ModelConfig.from_path(stories_path).dtype == here


def test_cpu_threads_precedence():
    assert cpu_threads(3, 1, environ={"OMP_NUM_THREADS": "1"}, cores=8) == 3
    assert cpu_threads(None, 1, environ={"OMP_NUM_THREADS": "2"}, cores=8) == 2
    assert cpu_threads(None, 2, environ={}, cores=8) == 4
    assert cpu_threads(None, 4, environ={"OMP_NUM_THREADS": ""}, cores=2) == 1
    try:
        ServerArgs.from_kwargs(cpu_threads=0)
    except ServerArgsError as e:
        assert "--cpu-threads must be >= 1" in str(e)
    else:
        raise AssertionError("cpu_threads=0 accepted")


def test_openmp_env_keeps_the_users_choice():
    assert openmp_env({}) == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "10000"}
    assert openmp_env({"GOMP_SPINCOUNT": "100"}) == {"OMP_WAIT_POLICY": "ACTIVE"}
    assert openmp_env({"OMP_WAIT_POLICY": "PASSIVE"}) == {}
    assert openmp_env({"OMP_WAIT_POLICY": "ACTIVE"}) == {}


def test_auto_dtype_for_weights_kept_quantized(stories_path):
    """The int8 kernels compute in fp32: ``--dtype auto`` with int8 weights means float32 (bf16 would
    only add conversions around every linear); GGUF blocks mean bfloat16 where the 4-bit decode kernel
    takes bf16 activations natively (AVX512-BF16), else float32; float weights keep auto's CPU choice."""
    from radixlm.kernels.quant.gemm import bf16_decode_preferred
    from radixlm.srt.server_args import ServerArgs
    from tests.conftest import STORIES_GGUF

    def dtype(**kw):
        return ServerArgs.from_kwargs(device="cpu", **kw).model_dtype()

    gguf_auto = "bfloat16" if bf16_decode_preferred(cpu_info(), torch.backends.cpu.get_cpu_capability()) else "float32"
    assert dtype(model_path=stories_path, quantization="int8") == "float32"
    assert dtype(model_path=str(STORIES_GGUF)) == gguf_auto  # a GGUF file keeps its blocks by default
    assert dtype(model_path=stories_path, quantization="gguf") == gguf_auto
    assert dtype(model_path=str(STORIES_GGUF), quantization="none") == "auto"
    assert dtype(model_path=stories_path) == "auto"
    assert dtype(model_path=stories_path, quantization="int8", dtype="bfloat16") == "bfloat16"
    assert dtype(model_path=str(STORIES_GGUF), enable_deterministic_inference=True) == "auto"  # loads dequantized


def test_bf16_decode_is_preferred_with_avx512_bf16_only():
    from radixlm.kernels.quant.gemm import bf16_decode_preferred

    zen4 = CpuInfo("AMD EPYC", ("avx2", "avx512f", "avx512_bf16"), 2)
    spr = CpuInfo("Xeon", ("avx2", "avx512f", "avx512_bf16", "amx_bf16"), 2)
    assert bf16_decode_preferred(zen4, "AVX512") and bf16_decode_preferred(spr, "AVX512")
    assert not bf16_decode_preferred(zen4, "AVX2")  # an AVX2 build has no vdpbf16ps kernel
    assert not bf16_decode_preferred(CpuInfo("Xeon", ("avx2", "avx512f"), 2), "AVX512")  # Ice Lake: fp32


def test_tune_malloc_keeps_the_users_choice():
    from radixlm.srt.cpu_runtime import tune_malloc

    assert tune_malloc({"MALLOC_MMAP_THRESHOLD_": "65536"}) is False
    assert tune_malloc({"MALLOC_TRIM_THRESHOLD_": "0"}) is False
    assert tune_malloc({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}) is False


_MMAPPED_PROBE = """
import ctypes, sys
from radixlm.srt.cpu_runtime import tune_malloc
if sys.argv[1] == "tune":
    assert tune_malloc({})
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
p = libc.malloc(24 << 20)  # a (128, 49152) fp32 block
size_field = ctypes.c_size_t.from_address(p - ctypes.sizeof(ctypes.c_size_t)).value
print(size_field & 2)  # glibc's IS_MMAPPED bit of the chunk header
"""


def test_tune_malloc_serves_logits_sized_blocks_from_the_reused_heap():
    """glibc maps a fresh 24 MiB block with mmap (and unmaps it on free: every decode step faulted its
    logits' pages in again); after tune_malloc it comes from the heap, whose freed blocks are reused."""
    import platform
    import subprocess
    import sys

    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")

    def mmapped(mode: str) -> bool:
        out = subprocess.run([sys.executable, "-c", _MMAPPED_PROBE, mode], capture_output=True, text=True, check=True)
        return out.stdout.strip() == "2"

    assert mmapped("plain")
    assert not mmapped("tune")
