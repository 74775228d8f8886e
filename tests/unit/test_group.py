"""A vLLM engine spanning the pods of a group: parallelism per pod, a worker pod's checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from aflowrl import group
from aflowrl.cli import main
from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError

GROUP_ENV = {
    "AFLOWRL_GROUP_LEADER": "demo-rollout-group-0.demo-rollout-group.team-a",
    "AFLOWRL_GROUP_SIZE": "2",
    "AFLOWRL_GROUP_RANK": "1",
    "AFLOWRL_GROUP_PORT": "29610",
}
MULTI = """
rollout:
  engine: vllm
  nodesPerReplica: 2
  resources: {gpus: 8}
  vllm: {tensorParallelSize: 8, pipelineParallelSize: 2, distributedBackend: %s}
"""


def _spec(backend: str = "mp") -> RunSpec:
    return RunSpec.from_yaml(MULTI % backend)


def test_outside_a_group_there_is_no_topology(monkeypatch):
    for name in GROUP_ENV:
        monkeypatch.delenv(name, raising=False)
    assert group.GroupTopology.from_env() is None


def test_the_topology_comes_from_the_operator_s_variables(monkeypatch):
    for name, value in GROUP_ENV.items():
        monkeypatch.setenv(name, value)
    topology = group.GroupTopology.from_env()
    assert topology == group.GroupTopology(
        leader=GROUP_ENV["AFLOWRL_GROUP_LEADER"], size=2, rank=1, port=29610
    )
    assert not topology.is_leader
    monkeypatch.setenv("AFLOWRL_GROUP_RANK", "2")
    with pytest.raises(FailedPreconditionError, match="AFLOWRL_GROUP_RANK=2"):
        group.GroupTopology.from_env()


def test_one_pod_runs_in_process_or_with_local_workers():
    one = RunSpec().rollout.vllm
    assert group.engine_parallel_args(one, None) == {
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "distributed_executor_backend": "uni",
    }
    four = RunSpec.from_yaml(
        "rollout: {engine: vllm, resources: {gpus: 4}, vllm: {tensorParallelSize: 2, "
        "pipelineParallelSize: 2}}"
    ).rollout.vllm
    assert group.engine_parallel_args(four, None)["distributed_executor_backend"] == "mp"


def test_across_pods_mp_names_the_master_and_this_node_s_rank():
    topology = group.GroupTopology(leader="leader.ns", size=2, rank=1, port=29610)
    assert group.engine_parallel_args(_spec("mp").rollout.vllm, topology) == {
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "mp",
        "nnodes": 2,
        "node_rank": 1,
        "master_addr": "leader.ns",
        "master_port": 29610,
    }
    # Ray places the workers itself: no node ranks.
    assert group.engine_parallel_args(_spec("ray").rollout.vllm, topology) == {
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "distributed_executor_backend": "ray",
    }


def _engine_args(spec: RunSpec, *, cuda: bool) -> dict[str, object]:
    policy = spec.policy
    return group.engine_args(
        spec.rollout.vllm,
        "/models/p",
        dtype=policy.dtype,
        trust_remote_code=policy.trust_remote_code,
        lora=policy.lora,
        cuda=cuda,
    )


def test_a_worker_is_configured_like_its_leader():
    spec = RunSpec.from_yaml((MULTI % "mp") + "policy: {model: tiny, lora: {rank: 12}}\n")
    args = _engine_args(spec, cuda=True)
    assert args["model"] == "/models/p" and args["dtype"] == "bfloat16"
    assert (args["enable_lora"], args["max_lora_rank"]) == (True, 16)
    assert args["max_model_len"] == spec.rollout.vllm.max_model_len
    assert args["worker_extension_cls"] == "aflowrl.rollout.vllm_worker.AflowrlWorkerExtension"
    # Every rank's worker builds the project's weight-transfer engine (the nccl receive path).
    assert args["weight_transfer_config"] == {"backend": "aflowrl"}
    assert _engine_args(spec, cuda=False)["enforce_eager"] is True


@pytest.mark.parametrize("backend", ["mp", "ray"])
def test_the_leader_s_engine_spans_the_group(backend):
    """The leader's engine (``VllmEngine``) is built from the worker's arguments plus the
    group's parallelism: mp names the master and node 0, ray leaves placement to Ray; its weight
    group has every rank of the replica (tensor x pipeline parallel)."""
    from aflowrl.rollout.vllm_engine import VllmEngine

    spec = _spec(backend)
    engine = VllmEngine(
        Path("/models/p"),
        engine_spec=spec.rollout.vllm,
        dtype=spec.policy.dtype,
        trust_remote_code=spec.policy.trust_remote_code,
        lora=spec.policy.lora,
    )
    leader = group.GroupTopology(leader="leader.ns", size=2, rank=0, port=29610)
    args = engine.engine_arguments(leader, cuda=True)
    expected = _engine_args(spec, cuda=True) | group.engine_parallel_args(spec.rollout.vllm, leader)
    assert args == expected
    assert args["distributed_executor_backend"] == backend
    assert args["tensor_parallel_size"] * args["pipeline_parallel_size"] == 16
    if backend == "mp":
        assert (args["nnodes"], args["node_rank"], args["master_addr"]) == (2, 0, "leader.ns")
        assert args["master_port"] == 29610
    else:
        assert "nnodes" not in args and "master_addr" not in args
    assert engine.weight_group_ranks == spec.rollout.engine_gpus == 16
    # Outside a group: one pod's engine, in-process for one GPU.
    alone = VllmEngine(Path("/models/p"))
    single = alone.engine_arguments(None, cuda=False)
    assert single["distributed_executor_backend"] == "uni" and "nnodes" not in single
    assert single["dtype"] == "float32" and alone.weight_group_ranks == 1


def test_a_worker_pod_checks_where_it_runs(tmp_path, monkeypatch, capsys):
    plain = tmp_path / "plain.yaml"
    plain.write_text("rollout: {engine: vllm}\n")
    assert main(["serve", "rollout-worker", "-f", str(plain)]) == 2
    assert "rollout.nodesPerReplica > 1" in capsys.readouterr().err

    multi = tmp_path / "multi.yaml"
    multi.write_text(MULTI % "mp")
    for name in GROUP_ENV:
        monkeypatch.delenv(name, raising=False)
    assert main(["serve", "rollout-worker", "-f", str(multi)]) == 2
    assert "AFLOWRL_GROUP_LEADER" in capsys.readouterr().err

    for name, value in GROUP_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AFLOWRL_GROUP_RANK", "0")
    assert main(["serve", "rollout-worker", "-f", str(multi)]) == 2
    assert "is the group's leader" in capsys.readouterr().err
    monkeypatch.setenv("AFLOWRL_GROUP_RANK", "1")
    monkeypatch.setenv("AFLOWRL_GROUP_SIZE", "3")
    assert main(["serve", "rollout-worker", "-f", str(multi)]) == 2
    assert "AFLOWRL_GROUP_SIZE=3 differs" in capsys.readouterr().err


def test_ray_workers_without_ray_say_how_to_get_it(monkeypatch):
    monkeypatch.setattr(group.sys, "executable", "/nonexistent/python")
    monkeypatch.setenv("PATH", "/nonexistent")
    topology = group.GroupTopology(leader="leader.ns", size=2, rank=1, port=29610)
    with pytest.raises(FailedPreconditionError, match=r"aflow-rl\[ray\]"):
        group.worker_command(_spec("ray"), topology)
