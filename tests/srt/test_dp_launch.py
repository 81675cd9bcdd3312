"""What the launcher starts for ``--dp-size``: process names, per-replica sockets, CPU threads."""

from __future__ import annotations

import dataclasses

from radixlm.managers.ipc import IpcPaths
from radixlm.srt.cpu_runtime import cpu_threads
from radixlm.srt.dp_launch import scheduler_name, scheduler_specs, scheduler_title
from radixlm.srt.server_args import ServerArgs


def _target(*args) -> None:  # stands in for run_scheduler_process
    raise AssertionError("not called")


def test_one_replica_is_launched_as_before(tmp_path):
    paths = IpcPaths.in_dir(str(tmp_path))
    specs = scheduler_specs(ServerArgs(tp_size=2), paths, _target)
    assert [s[0] for s in specs] == ["scheduler", "scheduler-tp1"]
    assert all(s[2][1] is paths for s in specs) and [s[2][2] for s in specs] == [0, 1]
    assert specs[0][2][0].cpu_threads is None  # the scheduler splits the cores between its TP ranks


def test_replicas_get_own_sockets_names_and_a_share_of_the_cores(tmp_path):
    paths = IpcPaths.in_dir(str(tmp_path))
    specs = scheduler_specs(ServerArgs(dp_size=2, tp_size=2), paths, _target)
    assert [s[0] for s in specs] == ["scheduler-dp0", "scheduler-dp0-tp1", "scheduler-dp1", "scheduler-dp1-tp1"]
    replica_paths = [s[2][1] for s in specs]
    assert replica_paths[0] == replica_paths[1] != replica_paths[2] == replica_paths[3]
    assert replica_paths[2].scheduler_input == f"ipc://{tmp_path}/dp1/scheduler_input"
    assert replica_paths[2].detokenizer_input == paths.detokenizer_input
    assert {s[2][0].cpu_threads for s in specs} == {cpu_threads(None, 4)}  # OMP_NUM_THREADS, else cores // 4
    explicit = scheduler_specs(dataclasses.replace(ServerArgs(dp_size=2), cpu_threads=3), paths, _target)
    assert {s[2][0].cpu_threads for s in explicit} == {3}
    # unseeded sampling: each replica its own stream, the TP ranks of a replica the same one
    assert [s[2][0].random_seed for s in specs] == [0, 0, 1, 1]
    seeded = scheduler_specs(dataclasses.replace(ServerArgs(dp_size=3), random_seed=42), paths, _target)
    assert [s[2][0].random_seed for s in seeded] == [42, 43, 44]
    assert scheduler_specs(dataclasses.replace(ServerArgs(), random_seed=42), paths, _target)[0][2][0].random_seed == 42
    assert scheduler_name(3, 0, 4) == "scheduler-dp3"
    # ps titles, as SGLang's sglang::scheduler_DP1_TP0: replicas told apart
    assert [scheduler_title("radixlm-" + s[0], s[2][2]) for s in specs] == [
        "scheduler_DP0_TP0", "scheduler_DP0_TP1", "scheduler_DP1_TP0", "scheduler_DP1_TP1"]
    assert scheduler_title("radixlm-scheduler", 0) == "scheduler_TP0"
    assert scheduler_title("radixlm-scheduler-tp1", 1) == "scheduler_TP1"
    assert scheduler_title("SpawnProcess-1", 2) == "scheduler_TP2"


def test_a_replica_removes_the_whole_launch_directory(tmp_path):
    root = tmp_path / "launch"
    root.mkdir()
    paths = IpcPaths.in_dir(str(root))
    replica = paths.for_dp_rank(1, 2)
    assert (root / "dp1").is_dir()
    replica.remove()  # what an orphaned scheduler does
    assert not root.exists()
