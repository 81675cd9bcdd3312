"""Without a working C++ compiler, ``--attention-backend cpu`` is a clear error naming the build, and
``auto`` falls back to torch_native (with a warning) instead of failing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest


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


def test_a_built_library_loads_without_the_compiler_or_ninja(tmp_path):
    """Once its digest folder holds the library, a start only loads it: no compiler check, no ninja
    (which rebuilt everything whenever build.ninja differed, e.g. from another virtual environment)."""

    from radixlm.kernels.cpu_extension import _capability, build_directory, cpu_kernels_error

    if cpu_kernels_error() is not None:
        pytest.skip(f"the C++ kernels do not build here: {cpu_kernels_error()}")
    built = build_directory() / f"radixlm_cpu_{_capability().lower()}.so"
    target = tmp_path / "cache" / built.parent.name
    target.mkdir(parents=True)
    shutil.copy(built, target / built.name)  # the library alone: no build.ninja, no objects
    script = textwrap.dedent("""
        import torch
        from radixlm.kernels.cpu_extension import OPS, load_cpu_kernels
        load_cpu_kernels()
        print("OPS", all(hasattr(torch.ops.radixlm_cpu, op) for op in OPS))
    """)
    env = {**os.environ, "CXX": str(tmp_path / "no-such-compiler"), "PATH": str(tmp_path / "empty-bin"),
           "RADIXLM_KERNEL_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OPS True" in out.stdout
    assert sorted(p.name for p in target.iterdir()) == sorted([built.name, "radixlm-build.lock"])
