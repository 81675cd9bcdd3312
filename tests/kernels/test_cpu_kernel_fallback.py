"""Without a working C++ compiler, ``--attention-backend cpu`` is a clear error naming the build, and
``auto`` falls back to torch_native (with a warning) instead of failing."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_cpu_backend_without_a_compiler_is_a_clear_error(tmp_path):
    script = textwrap.dedent("""
        from radixlm.kernels.attention import create_attention_backend
        from radixlm.kernels.cpu_extension import CpuKernelsUnavailable
        kw = dict(num_heads=4, num_kv_heads=2, head_dim=16, scaling=0.25)
        print("BACKEND", create_attention_backend("auto", "cpu", **kw).name)
        try:
            create_attention_backend("cpu", "cpu", **kw)
        except CpuKernelsUnavailable as e:
            print("EXPLICIT", type(e).__name__, e)
    """)
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "RADIXLM_KERNEL_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BACKEND torch_native" in out.stdout
    assert "the C++ CPU kernel is unavailable" in out.stderr
    assert "EXPLICIT CpuKernelsUnavailable building radixlm's C++ CPU kernels" in out.stdout
