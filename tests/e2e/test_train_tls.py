"""``aflowrl train`` on this machine with gRPC TLS and mutual TLS, end to end.

The command a user types: services started by the local launcher, every link (the launcher's
health checks, the trainer's clients, the weight relay) over TLS with certificates made here by
``cryptography`` (a CA, a server certificate for 127.0.0.1/localhost, a client certificate).
A directory whose CA did not sign the servers' certificate stops the run at start, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from certificates import Pki, make_pki

pytestmark = pytest.mark.slow

SPEC = """
policy: {model: tiny, dtype: float32}
learner:
  fsdp: {mixedPrecision: none}
  loss: {miniBatchSize: 2, microBatchSize: 2, klCoef: 0.0}
environment:
  benchmarks: [humaneval]
  executor: {type: surrogate}
  replicas: {min: 1, max: 1}
  evaluation: {maxProblems: 2, repeats: 1}
  search: {maxSteps: 1, maxAdmissibleActions: 4, maxObservationChars: 800}
trainer: {iterations: 1, tasksPerIteration: 1, groupSize: 2, checkpointEvery: 1,
          finalTestEval: false}
"""
"""One iteration of one group of two one-step episodes: every service and link is used once."""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _train(tmp_path: Path, env: dict[str, str], *, mtls: bool = False) -> tuple[int, str, Path]:
    spec = tmp_path / "run.yaml"
    spec.write_text(SPEC + ("grpc: {mtls: true}\n" if mtls else ""))
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "aflowrl", "train", "-f", str(spec), "--run-dir", str(run_dir)],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr, run_dir


def _service_logs(run_dir: Path) -> str:
    return "\n".join(
        (run_dir / "logs" / f"{name}.log").read_text() for name in ("env-0", "rollout-0", "learner")
    )


def test_a_local_training_over_tls(tmp_path, pki):
    code, output, run_dir = _train(tmp_path, {"AFLOWRL_TLS_DIR": str(pki.server)})
    assert code == 0, output
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0]
    assert records[0]["charts/rows_trained"] > 0
    logs = _service_logs(run_dir)
    assert logs.count("(TLS, plaintext health on port") == 3, logs


def test_a_local_training_over_mutual_tls_with_a_client_certificate(tmp_path, pki):
    env = {"AFLOWRL_TLS_DIR": str(pki.server), "AFLOWRL_TLS_CLIENT_DIR": str(pki.client)}
    code, output, run_dir = _train(tmp_path, env, mtls=True)
    assert code == 0, output
    assert (run_dir / "metrics.jsonl").read_text().count("\n") == 1
    assert _service_logs(run_dir).count("(mutual TLS, plaintext health on port") == 3


def test_a_ca_that_did_not_sign_the_servers_stops_the_run_at_start(tmp_path, pki):
    mixed = tmp_path / "mixed"
    shutil.copytree(pki.server, mixed)
    shutil.copy(pki.other_ca / "ca.crt", mixed / "ca.crt")
    code, output, run_dir = _train(tmp_path, {"AFLOWRL_TLS_DIR": str(mixed)})
    assert code == 1, output
    assert "not signed by the CA this client trusts" in output
    assert not (run_dir / "metrics.jsonl").exists()
