"""RunSpec: defaults, documents, and errors that name the field."""

from __future__ import annotations

import pytest
import yaml

from aflowrl.config import ConfigError, RunSpec
from aflowrl.config.run import API_GROUP, API_VERSION


def test_default_spec_is_valid_and_round_trips():
    spec = RunSpec()
    doc = spec.to_document()
    assert doc["environment"]["benchmarks"] == ["humaneval"]
    assert doc["learner"]["algorithm"]["type"] == "gigpo"
    assert "maxPromptTokens" in doc["policy"]  # camelCase keys, as in a TrainingRun
    assert RunSpec.from_document(doc) == spec


def test_documents_have_one_spelling_and_strict_types():
    with pytest.raises(ConfigError, match=r"spec\.trainer\.group_size: unknown field"):
        RunSpec.from_document({"trainer": {"group_size": 8}})
    for value in ("5", True, 2.5):
        with pytest.raises(ConfigError, match=r"spec\.trainer\.iterations"):
            RunSpec.from_document({"trainer": {"iterations": value}})
    # JSON has one number type, and null means "not set", as on the API server.
    assert RunSpec.from_document({"trainer": {"iterations": 5.0}}).trainer.iterations == 5
    assert RunSpec.from_document({"policy": {"lora": None}, "trainer": None}) == RunSpec()
    # Python code may still use field names.
    assert RunSpec.model_validate({"trainer": {"group_size": 8}}).trainer.group_size == 8


def test_an_empty_document_is_refused_not_read_as_the_default():
    with pytest.raises(ConfigError, match=r"run\.yaml: the document is empty"):
        RunSpec.from_yaml("", source="run.yaml")
    with pytest.raises(ConfigError, match="the document is empty"):
        RunSpec.from_yaml("null\n")
    run = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TrainingRun"}
    with pytest.raises(ConfigError, match=r"spec: a TrainingRun needs a spec mapping"):
        RunSpec.from_document({**run, "metadata": {"name": "x"}, "spec": None})
    with pytest.raises(ConfigError, match=r"spec: a TrainingRun needs a spec mapping \(missing"):
        RunSpec.from_document({**run, "metadata": {"name": "x"}})
    assert RunSpec.from_yaml("{}") == RunSpec()


def test_training_run_document_is_accepted():
    doc = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "TrainingRun",
        "metadata": {"name": "demo"},
        "spec": {"environment": {"benchmarks": ["gsm8k"], "data": {"dir": "/data"}}},
    }
    assert RunSpec.from_document(doc).environment.training_benchmarks == ("gsm8k",)


def test_yaml_with_discriminated_unions():
    text = """
    learner:
      algorithm: {type: grpo, normByStd: false}
    environment:
      executor: {type: openai, baseUrl: "http://vllm:8000/v1", model: qwen}
    weightTransport: {type: filesystem, path: /shared/weights}
    """
    spec = RunSpec.from_yaml(text)
    assert spec.learner.algorithm.type == "grpo"
    assert spec.environment.executor.type == "openai"
    assert spec.weight_transport.type == "filesystem"


# (document, the field path that must appear in the message)
INVALID = [
    ({"learner": {"optimizer": {"lr": -1}}}, "spec.learner.optimizer.lr"),
    ({"learner": {"optimizer": {"lr": "fast"}}}, "spec.learner.optimizer.lr"),
    ({"trainer": {"iterations": -1}}, "spec.trainer.iterations"),
    ({"rollut": {}}, "spec.rollut"),
    ({"rollout": {"sampling": {"topP": 0}}}, "spec.rollout.sampling.topP"),
    ({"rollout": {"resources": {"memory": "lots"}}}, "spec.rollout.resources.memory"),
    ({"environment": {"benchmarks": ["mmlu"]}}, "spec.environment.benchmarks[0]"),
    ({"learner": {"algorithm": {"type": "dqn"}}}, "spec.learner.algorithm"),
    ({"learner": {"algorithm": {"type": "gigpo", "gamma": 1.5}}}, "spec.learner.algorithm.gamma"),
    ({"environment": {"executor": {"type": "openai"}}}, "spec.environment.executor"),
    ({"environment": {"replicas": {"min": 3, "max": 2}}}, "spec.environment.replicas"),
    ({"grpc": {"maxMessageMib": 0}}, "spec.grpc.maxMessageMib"),
    ({"weightTransport": {"type": "grpc", "chunkMib": 0}}, "spec.weightTransport.chunkMib"),
    # contradictory fields, checked across the spec
    (
        {"environment": {"search": {"selection": "fused", "valueSource": "none"}}},
        "environment.search.valueSource",
    ),
    ({"policy": {"value": {"enabled": False}}}, "environment.search.valueSource"),
    ({"policy": {"value": {"min": 0.5, "max": 0.1}}}, "spec.policy.value"),
    ({"environment": {"search": {"duplicatePenalty": -1}}}, "duplicatePenalty"),
    ({"environment": {"search": {"valueSource": "critic"}}}, "learner.algorithm.type"),
    ({"trainer": {"groupSize": 1}}, "trainer.groupSize"),
    ({"rollout": {"sampling": {"maxTokens": 512}}}, "policy.maxResponseTokens"),
    (
        {"weightTransport": {"type": "nccl"}, "rollout": {"resources": {"gpus": 1}}},
        "learner.resources.gpus",
    ),
    (
        {"rollout": {"engine": "vllm", "vllm": {"maxModelLen": 1024}}},
        "rollout.vllm.maxModelLen",
    ),
    ({"learner": {"loss": {"miniBatchSize": 4, "microBatchSize": 8}}}, "microBatchSize"),
    ({"learner": {"procsPerNode": 2, "resources": {"gpus": 4}}}, "procsPerNode"),
    ({"learner": {"optimizer": {"betas": [0.9, 1.0]}}}, "betas[1]"),
    # the benchmarks a run trains on and holds out
    ({"environment": {"benchmark": "gsm8k"}}, "write benchmarks: [gsm8k]"),
    ({"environment": {"benchmarks": []}}, "spec.environment.benchmarks"),
    ({"environment": {"benchmarks": ["gsm8k", "gsm8k"]}}, "benchmarks lists gsm8k more than once"),
    ({"environment": {"benchmarks": ["mixed", "math"]}}, "'mixed' means all six"),
    ({"environment": {"heldOutBenchmarks": ["mixed"]}}, "spec.environment.heldOutBenchmarks[0]"),
    (
        {"environment": {"benchmarks": ["gsm8k"], "heldOutBenchmarks": ["gsm8k"]}},
        "heldOutBenchmarks: gsm8k is also in benchmarks",
    ),
    ({"environment": {"benchmarkWeights": {"gsm8k": 1}}}, "benchmarkWeights: gsm8k is no training"),
    ({"environment": {"benchmarkWeights": {"humaneval": 0}}}, "benchmarkWeights.humaneval"),
    (
        {
            "environment": {
                "benchmarks": ["mixed"],
                "heldOutBenchmarks": ["drop"],
                "benchmarkWeights": {"drop": 2},
            }
        },
        "benchmarkWeights: drop is no training benchmark",
    ),
]


@pytest.mark.parametrize(("doc", "field"), INVALID, ids=[f for _, f in INVALID])
def test_invalid_spec_names_the_field(doc, field):
    with pytest.raises(ConfigError) as info:
        RunSpec.from_document(doc)
    assert field in str(info.value)


def test_mixed_means_every_benchmark_but_the_held_out_ones():
    env = RunSpec.from_document(
        {
            "environment": {
                "benchmarks": ["mixed"],
                "heldOutBenchmarks": ["drop"],
                "benchmarkWeights": {"gsm8k": 3},
            }
        }
    ).environment
    assert env.training_benchmarks == ("gsm8k", "math", "humaneval", "mbpp", "hotpotqa")
    assert env.served_benchmarks == (*env.training_benchmarks, "drop")
    assert env.task_weights == (3.0, 1.0, 1.0, 1.0, 1.0)
    assert env.needing_data_dir == ("gsm8k", "math", "mbpp", "hotpotqa", "drop")
    listed = RunSpec.from_document(
        {"environment": {"benchmarks": ["humaneval"], "heldOutBenchmarks": ["mbpp"]}}
    )
    assert listed.environment.training_benchmarks == ("humaneval",)
    assert listed.needs_data_dir() and not RunSpec().needs_data_dir()


def test_all_problems_are_reported_at_once():
    with pytest.raises(ConfigError) as info:
        RunSpec.from_document(
            {"trainer": {"iterations": -1, "seed": -1}, "policy": {"dtype": "int4"}}
        )
    assert len(info.value.problems) == 3


def test_wrong_kind_and_bad_yaml_are_clear():
    with pytest.raises(ConfigError, match="expected kind TrainingRun"):
        RunSpec.from_document({"apiVersion": "v1", "kind": "Pod", "spec": {}})
    with pytest.raises(ConfigError, match=r"run\.yaml: (line \d+: )?not valid YAML"):
        RunSpec.from_yaml("a: [1, 2", source="run.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        RunSpec.from_document(["a"])


def test_spec_is_immutable():
    spec = RunSpec()
    with pytest.raises(ValueError, match="frozen"):
        spec.trainer = None  # type: ignore[misc,assignment]


def test_every_field_is_documented():
    missing = []

    def walk(model: type, path: str) -> None:
        for name, info in model.model_fields.items():
            if not info.description:
                missing.append(f"{path}.{name}")
            for arg in _model_types(info.annotation):
                walk(arg, f"{path}.{name}")

    walk(RunSpec, "spec")
    assert not missing, missing


def _model_types(annotation):
    from typing import get_args

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _model_types(arg)]


def test_example_yaml_of_the_defaults_validates():
    text = yaml.safe_dump(RunSpec().to_document(exclude_defaults=True))
    assert RunSpec.from_yaml(text) == RunSpec()


@pytest.mark.parametrize(
    ("document", "line"),
    [
        (
            "trainer:\n  group_size: 4\n",
            "spec.trainer.group_size: unknown field; did you mean 'groupSize'?",
        ),
        (
            "trainer:\n  iteratons: 3\n",
            "spec.trainer.iteratons: unknown field; did you mean 'iterations'?",
        ),
        (
            "environment:\n  executor:\n    type: openai\n    baseUrll: http://h/v1\n",
            "spec.environment.executor.baseUrll: unknown field; did you mean 'baseUrl'?",
        ),
        ("trainerr: {}\n", "spec.trainerr: unknown field; did you mean 'trainer'?"),
    ],
)
def test_a_misspelt_field_gets_the_nearest_known_one(document, line):
    with pytest.raises(ConfigError) as caught:
        RunSpec.from_yaml(document, source="run.yaml")
    assert str(caught.value).startswith(f"run.yaml: {line}")


def test_an_unknown_field_with_nothing_near_gets_no_guess():
    with pytest.raises(ConfigError) as caught:
        RunSpec.from_yaml("policy:\n  zzzqqq: 1\n")
    assert "did you mean" not in str(caught.value)
    assert "unknown field (check its spelling" in str(caught.value)


@pytest.mark.parametrize(
    ("transport", "expected"),
    [
        ("{type: grpc}", 1800.0),
        ("{type: nccl, timeoutS: 600}", 1800.0),
        ("{type: nccl, timeoutS: 86400}", 86400.0 + 300.0),
    ],
)
def test_the_learners_collective_timeout_outlasts_a_weight_groups_longest_wait(transport, expected):
    # weightTransport.timeoutS may reach a day; a learner rank that waits in a gather while rank
    # 0 waits that long on a stalled replica must not be ended by its own 30-minute timeout.
    from aflowrl.config.transport import learner_collective_timeout_s

    spec = RunSpec.from_yaml(f"weightTransport: {transport}\n", source="t")
    timeout = learner_collective_timeout_s(spec.weight_transport)
    assert timeout == expected
    assert timeout > getattr(spec.weight_transport, "timeout_s", 0.0)
