"""Bad inputs of a local run fail before anything starts, naming what to fix."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import pytest

from aflowrl import presets
from aflowrl.config import ConfigError, RunSpec
from aflowrl.local import preflight
from aflowrl.local.errors import PreflightError
from aflowrl.local.launcher import local_spec, service_commands
from aflowrl.local.processes import free_ports


def _spec(**doc) -> RunSpec:
    return RunSpec.from_document(doc)


def test_the_embedded_default_and_runspecs_defaults_pass(aflow_data, monkeypatch):
    monkeypatch.setenv("AFLOWRL_DATA_DIR", str(aflow_data))  # what 'make demo' downloads first
    preflight.check_local_run(presets.load())
    preflight.check_local_run(RunSpec())


def test_the_embedded_default_without_its_data_says_to_download_it(monkeypatch, tmp_path):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    monkeypatch.setenv("AFLOWRL_CACHE_DIR", str(tmp_path))  # no 'aflowrl data download' yet
    with pytest.raises(PreflightError) as info:
        preflight.check_local_run(presets.load())
    assert info.value.field == "spec.environment.data.dir"
    assert "math_validate.jsonl" in str(info.value)
    assert "aflowrl data download" in str(info.value)


def test_a_benchmark_without_a_packaged_copy_needs_a_data_dir(monkeypatch):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    with pytest.raises(PreflightError) as info:
        preflight.check_data(_spec(environment={"benchmarks": ["gsm8k"]}))
    assert info.value.field == "spec.environment.data.dir"
    assert "gsm8k_validate.jsonl" in str(info.value) and "AFLOWRL_DATA_DIR" in str(info.value)


def test_a_held_out_benchmark_needs_its_data_too(monkeypatch, tmp_path):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    doc = {"benchmarks": ["humaneval"], "heldOutBenchmarks": ["mbpp"]}
    with pytest.raises(PreflightError) as info:
        preflight.check_data(_spec(environment=doc))
    assert info.value.field == "spec.environment.data.dir" and "mbpp_test.jsonl" in str(info.value)
    for split in ("validate", "test"):  # the training benchmark's files, not the held-out one's
        (tmp_path / f"gsm8k_{split}.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    doc = {"benchmarks": ["gsm8k"], "heldOutBenchmarks": ["mbpp"], "data": {"dir": str(tmp_path)}}
    with pytest.raises(PreflightError, match=r"mbpp_validate\.jsonl does not exist"):
        preflight.check_data(_spec(environment=doc))


def test_a_missing_or_incomplete_data_dir_is_named(tmp_path):
    spec = _spec(environment={"benchmarks": ["gsm8k"], "data": {"dir": str(tmp_path / "nope")}})
    with pytest.raises(PreflightError, match="is not a directory"):
        preflight.check_data(spec)
    (tmp_path / "gsm8k_validate.jsonl").write_text('{"question": "1+1?", "answer": "#### 2"}\n')
    spec = _spec(environment={"benchmarks": ["gsm8k"], "data": {"dir": str(tmp_path)}})
    with pytest.raises(PreflightError, match=r"gsm8k_test\.jsonl does not exist"):
        preflight.check_data(spec)


def test_a_malformed_data_line_is_named(tmp_path):
    for split in ("validate", "test"):
        (tmp_path / f"gsm8k_{split}.jsonl").write_text("{not json\n")
    spec = _spec(environment={"benchmarks": ["gsm8k"], "data": {"dir": str(tmp_path)}})
    with pytest.raises(PreflightError, match=r"gsm8k_validate.jsonl.*1"):
        preflight.check_data(spec)


def _openai(base_url: str) -> RunSpec:
    return _spec(environment={"executor": {"type": "openai", "baseUrl": base_url}})


def test_an_unreachable_executor_is_named():
    port = free_ports(1)[0]  # nothing listens there
    with pytest.raises(PreflightError) as info:
        preflight.check_executor(_openai(f"http://127.0.0.1:{port}/v1"))
    assert info.value.field == "spec.environment.executor.baseUrl"
    assert f"cannot reach http://127.0.0.1:{port}/v1" in str(info.value)


def test_an_executor_that_answers_anything_is_reachable():
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        preflight.check_executor(_openai(f"http://127.0.0.1:{server.server_port}/v1"))
    finally:
        server.shutdown()
        server.server_close()


def test_a_missing_policy_directory_is_named(tmp_path):
    with pytest.raises(PreflightError) as info:
        preflight.check_policy(_spec(policy={"model": str(tmp_path / "Qwen2.5-7B")}))
    assert info.value.field == "spec.policy.model" and "nothing is downloaded" in str(info.value)


def test_the_nccl_transport_is_accepted_on_cpus_and_refused_across_device_kinds():
    preflight.check_local_run(_spec(weightTransport={"type": "nccl"}))  # gloo between CPUs
    with pytest.raises(ConfigError, match="same kind of device"):
        _spec(weightTransport={"type": "nccl"}, rollout={"resources": {"gpus": 1}})


def test_cluster_paths_move_into_the_run_directory(tmp_path):
    spec = _spec(weightTransport={"type": "filesystem"})
    local = local_spec(spec, tmp_path / "run")
    assert local.trainer.checkpoint_dir == str((tmp_path / "run").resolve())
    assert local.weight_transport.path == str((tmp_path / "run").resolve() / "weights")
    chosen = _spec(trainer={"checkpointDir": "/data/ckpt"})
    assert local_spec(chosen, tmp_path) == chosen  # a path the user chose is kept


def test_service_commands_start_learner_ranks_under_torchrun():
    spec = _spec(learner={"procsPerNode": 2})
    ports = {"env-0": 1, "env-1": 2, "rollout-0": 3, "learner": 4, "rendezvous": 5}
    metrics = {"env-0": 11, "env-1": 12, "rollout-0": 13, "learner": 14}
    commands = service_commands(spec, Path("/run/spec.yaml"), ports, metrics)
    assert sorted(commands) == ["env-0", "env-1", "learner", "rollout-0"]
    learner = commands["learner"]
    assert learner[1:3] == ["-m", "torch.distributed.run"]
    assert learner[learner.index("--nproc-per-node") + 1] == "2"
    assert learner[-12:-8] == ["serve", "learner", "-f", "/run/spec.yaml"]
    assert learner[-4:] == ["--metrics-port", "14", "--health-port", "0"]
    env_1 = commands["env-1"]
    assert env_1[3:5] == ["serve", "env"]
    assert env_1[env_1.index("--port") + 1] == "2"
    assert env_1[env_1.index("--metrics-port") + 1] == "12"


def test_the_embedded_default_run_is_the_tiny_surrogate_math_run(aflow_data, monkeypatch):
    monkeypatch.setenv("AFLOWRL_DATA_DIR", str(aflow_data))
    spec = presets.load()
    assert spec.policy.model == "tiny" and spec.environment.benchmarks == ["math"]
    assert spec.environment.executor.type == "surrogate"
    assert spec.environment.replicas.min == 2 and spec.rollout.engine == "hf"
    assert spec.environment.search.max_admissible_actions <= 9  # short lists: fast on a CPU
    assert spec.trainer.warm_start.episodes > 0 and spec.trainer.warm_start.lr is not None
    preflight.check_local_run(spec)


def test_tls_asked_for_without_certificates_here_is_refused(monkeypatch, tmp_path):
    monkeypatch.delenv("AFLOWRL_TLS_DIR", raising=False)
    with pytest.raises(PreflightError, match="set AFLOWRL_TLS_DIR") as info:
        preflight.check_tls(_spec(grpc={"tlsSecret": "grpc-tls"}))
    assert info.value.field == "spec.grpc.tlsSecret"
    with pytest.raises(PreflightError, match="mutual TLS needs TLS") as info:
        preflight.check_tls(_spec(grpc={"mtls": True}))
    assert info.value.field == "spec.grpc.mtls"
    (tmp_path / "tls.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    monkeypatch.setenv("AFLOWRL_TLS_DIR", str(tmp_path))
    with pytest.raises(PreflightError, match=r"tls\.key is missing") as info:
        preflight.check_tls(_spec(grpc={"tlsSecret": "grpc-tls"}))
    assert info.value.field == "AFLOWRL_TLS_DIR"
    with pytest.raises(PreflightError, match=r"tls\.key is missing"):
        preflight.check_tls(_spec())  # AFLOWRL_TLS_DIR alone turns TLS on: its files are checked
    monkeypatch.delenv("AFLOWRL_TLS_DIR")
    preflight.check_tls(_spec())  # plaintext


def test_data_in_the_default_directory_is_found_without_any_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    monkeypatch.setenv("AFLOWRL_CACHE_DIR", str(tmp_path))
    data = tmp_path / "data"  # where 'aflowrl data download' puts the files by default
    data.mkdir()
    for split in ("validate", "test"):
        line = '{"id": "p", "question": "What is 1 + 1?", "answer": "2"}\n'
        (data / f"gsm8k_{split}.jsonl").write_text(line)
    preflight.check_data(_spec(environment={"benchmarks": ["gsm8k"]}))


def test_an_executor_model_the_endpoint_does_not_serve_is_named():
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"object": "list", "data": [{"id": "qwen-7b"}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        with pytest.raises(PreflightError) as info:
            preflight.check_executor(_openai(url))  # the spec's model: gpt-4o-mini
        assert info.value.field == "spec.environment.executor.model"
        assert "qwen-7b" in str(info.value)
        spec = _spec(
            environment={"executor": {"type": "openai", "baseUrl": url, "model": "qwen-7b"}}
        )
        preflight.check_executor(spec)
    finally:
        server.shutdown()
        server.server_close()
