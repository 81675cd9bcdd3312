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


def test_build_lock_removes_a_stale_torch_lock_and_excludes_other_builders(tmp_path):
    """A torch build lock left by a killed build no longer blocks later starts; a live builder does."""
    import fcntl


    from radixlm.kernels.cpu_extension import build_lock

    (tmp_path / "lock").write_text("")  # what an interrupted cpp_extension build leaves behind
    with build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()
        # another process cannot take the build lock while this one holds it
        probe = ("import fcntl, sys; f = open(sys.argv[1], 'w')\n"
                 "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB); print('got')\n"
                 "except BlockingIOError:\n    print('busy')")
        out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "radixlm-build.lock")],
                             capture_output=True, text=True, timeout=60).stdout.strip()
        assert out == "busy"
    with open(tmp_path / "radixlm-build.lock") as f:  # released afterwards
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
