"""One validator, two places: ``aflowrl spec validate`` and the API server (under the generated
CRD) refuse the same TrainingRun documents, naming the same field, and admit the same ones.

The API server is played by :mod:`crd_admission` (structural schema with jsonschema, then the
CRD's CEL rules with a CEL interpreter). Updates exercise the transition rules (immutable
fields) against the operator's own immutability check.
"""

# ruff: noqa: E501  (the tables keep one document per line)

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from aflowrl.cli import main
from aflowrl.config import RunSpec
from aflowrl.config.run import immutable_changes
from crd_admission import admit

ROOT = Path(__file__).resolve().parents[3]

GPU = {"cpu": "8", "memory": "64Gi", "gpus": 2}
FS = {"weightTransport": {"type": "filesystem"}, "storage": {"size": "10Gi"}}
DATA = {"environment": {"data": {"dir": "/data"}}}
SERVE = {"model": "/models/exec", "resources": {"gpus": 1}}


def multi_rollout(replicas: int) -> dict:
    return {
        "rollout": {
            "engine": "vllm",
            "replicas": replicas,
            "nodesPerReplica": 2,
            "resources": {"gpus": 8},
            "vllm": {"tensorParallelSize": 8, "pipelineParallelSize": 2},
        }
    }


def run(spec, **top) -> dict:
    doc = {
        "apiVersion": "aflowrl.io/v1alpha1",
        "kind": "TrainingRun",
        "metadata": {"name": "demo"},
        "spec": spec,
    }
    doc.update(top)
    return doc


# (document, the field both must name, or the fields of a document with several defects)
INVALID: list[tuple[dict, str | set[str]]] = [
    # strict types: no coercion of strings and booleans, one spelling per field
    (run({"trainer": {"iterations": "5"}}), "spec.trainer.iterations"),
    (run({"trainer": {"iterations": True}}), "spec.trainer.iterations"),
    (run({"trainer": {"iterations": 2.5}}), "spec.trainer.iterations"),
    (run({"trainer": {"checkpointEvery": "5"}}), "spec.trainer.checkpointEvery"),
    (run({"trainer": {"tasks_per_iteration": 4}}), "spec.trainer.tasks_per_iteration"),
    (run({"rollut": {}}), "spec.rollut"),
    (run({"rollout": {"sampling": {"stop": "</action>"}}}), "spec.rollout.sampling.stop"),
    (run({"suspend": "yes"}), "spec.suspend"),
    (run({"rollout": {"resources": {"memory": 16}}}), "spec.rollout.resources.memory"),
    # bounds and patterns
    (run({"trainer": {"iterations": -1}}), "spec.trainer.iterations"),
    (run({"learner": {"optimizer": {"betas": [1.5, 0.999]}}}), "spec.learner.optimizer.betas[0]"),
    (run({"learner": {"optimizer": {"betas": [0.9, 1.0]}}}), "spec.learner.optimizer.betas[1]"),
    (run({"learner": {"optimizer": {"betas": [0.9]}}}), "spec.learner.optimizer.betas"),
    (run({"learner": {"optimizer": {"lr": -1}}}), "spec.learner.optimizer.lr"),
    (run({"rollout": {"resources": {"cpu": "-1"}}}), "spec.rollout.resources.cpu"),
    (run({"rollout": {"resources": {"memory": "lots"}}}), "spec.rollout.resources.memory"),
    (run({"learner": {"resources": {"gpus": -1}}}), "spec.learner.resources.gpus"),
    (run({"learner": {"resources": {"shmSize": "1 GB"}}}), "spec.learner.resources.shmSize"),
    (run({"rollout": {"resources": {"rdma": 32}}}), "spec.rollout.resources.rdma"),
    (run({"rollout": {"sampling": {"topP": 0}}}), "spec.rollout.sampling.topP"),
    (run({"environment": {"benchmarks": ["mmlu"]}}), "spec.environment.benchmarks[0]"),
    (run({"environment": {"benchmarks": []}}), "spec.environment.benchmarks"),
    (run({"environment": {"heldOutBenchmarks": ["mixed"]}}), "spec.environment.heldOutBenchmarks[0]"),
    (run({"environment": {"benchmarkWeights": {"humaneval": 0}}}), "spec.environment.benchmarkWeights.humaneval"),
    # rules across the fields of the environment and the run
    (run({**DATA, "environment": {**DATA["environment"], "benchmarks": ["gsm8k", "gsm8k"]}}), "spec.environment.benchmarks"),
    (run({**DATA, "environment": {**DATA["environment"], "benchmarks": ["mixed", "gsm8k"]}}), "spec.environment.benchmarks"),
    (run({"monitoring": {"loggers": ["console", "wandb", "wandb"]}}), "spec.monitoring.loggers"),
    (run({"monitoring": {"loggers": ["neptune"]}}), "spec.monitoring.loggers[0]"),
    (run({"monitoring": {"tensorboard": {"flushS": 0}}}), "spec.monitoring.tensorboard.flushS"),
    (run({**DATA, "environment": {**DATA["environment"], "benchmarks": ["gsm8k", "math"], "heldOutBenchmarks": ["math"]}}), "spec.environment.heldOutBenchmarks"),
    (run({**DATA, "environment": {**DATA["environment"], "heldOutBenchmarks": ["drop", "drop"]}}), "spec.environment.heldOutBenchmarks"),
    (run({**DATA, "environment": {**DATA["environment"], "benchmarks": ["gsm8k"], "benchmarkWeights": {"math": 2}}}), "spec.environment.benchmarkWeights"),
    (run({**DATA, "environment": {**DATA["environment"], "benchmarks": ["mixed"], "heldOutBenchmarks": ["drop"], "benchmarkWeights": {"drop": 2}}}), "spec.environment.benchmarkWeights"),
    (run({"environment": {"evaluation": {"racing": {"enabled": True}}, "search": {"selection": "aflow"}}}), "spec.environment.evaluation.racing.enabled"),
    (run({"policy": {"value": {"enabled": False}}}), "spec.environment.search.valueSource"),
    (run({"environment": {"evaluation": {"maxProblems": 0}}}), "spec.environment.evaluation.maxProblems"),
    (run({"environment": {"search": {"aflow": {"lambda": 2}}}}), "spec.environment.search.aflow.lambda"),
    (run({"grpc": {"maxMessageMib": 0}}), "spec.grpc.maxMessageMib"),
    (run({"grpc": {"tlsSecret": "Bad_Secret"}}), "spec.grpc.tlsSecret"),
    (run({"monitoring": {"serviceMonitor": {"interval": "15 seconds"}}}), "spec.monitoring.serviceMonitor.interval"),
    (run({"monitoring": {"logLevel": "debug"}}), "spec.monitoring.logLevel"),
    (run({"storage": {"size": "50GB"}}), "spec.storage.size"),
    (run({"storage": {"accessMode": "ReadWriteSometimes"}}), "spec.storage.accessMode"),
    (run({"images": {"pullSecrets": ["Bad_Name"]}}), "spec.images.pullSecrets[0]"),
    (run({"images": {"env": "has space:1"}}), "spec.images.env"),
    (run({"policy": {"lora": {"dropout": 1.0}}}), "spec.policy.lora.dropout"),
    (run({"policy": {"maxPromptTokens": 32}}), "spec.policy.maxPromptTokens"),
    (run({"trainer": {"offPolicy": {"maxStaleness": 9}}}), "spec.trainer.offPolicy.maxStaleness"),
    # discriminated unions: the tag, and a variant's fields only with its tag
    (run({"weightTransport": {"type": "grpc", "keepVersions": 3}}), "spec.weightTransport.keepVersions"),
    (run({"weightTransport": {"type": "carrier-pigeon"}}), "spec.weightTransport.type"),
    (run({"weightTransport": {"chunkMib": 8}}), "spec.weightTransport.type"),
    (run({"weightTransport": {"type": "grpc", "chunkMib": 0}}), "spec.weightTransport.chunkMib"),
    (run({"learner": {"algorithm": {"type": "grpo", "lam": 0.9}}}), "spec.learner.algorithm.lam"),
    (run({"learner": {"algorithm": {"type": "gigpo", "gamma": 1.5}}}), "spec.learner.algorithm.gamma"),
    (run({"learner": {"algorithm": {"type": "dqn"}}}), "spec.learner.algorithm.type"),
    (run({"environment": {"executor": {"type": "surrogate", "baseUrl": "http://x/v1"}}}), "spec.environment.executor.baseUrl"),
    (run({"environment": {"executor": {"type": "openai"}}}), "spec.environment.executor.baseUrl"),
    (run({"environment": {"executor": {"type": "openai", "baseUrl": "http://x/v1", "serve": SERVE}}}), "spec.environment.executor.baseUrl"),
    (run({"environment": {"executor": {"type": "openai", "baseUrl": "ftp://x"}}}), "spec.environment.executor.baseUrl"),
    (run({"environment": {"executor": {"type": "openai", "serve": {**SERVE, "replicas": 0}}}}), "spec.environment.executor.serve.replicas"),
    # cross-field rules
    (run({"environment": {"replicas": {"min": 3, "max": 2}}}), "spec.environment.replicas.min"),
    (run({"rollout": {"sampling": {"maxTokens": 512}}}), "spec.rollout.sampling.maxTokens"),
    (run({"environment": {"search": {"selection": "fused", "valueSource": "none"}}}), "spec.environment.search.valueSource"),
    (run({"environment": {"search": {"valueSource": "critic"}}}), "spec.environment.search.valueSource"),
    (run({"trainer": {"groupSize": 1}, "learner": {"loss": {"miniBatchSize": 8}}}), "spec.trainer.groupSize"),
    (run({"trainer": {"groupSize": 1}}), {"spec.trainer.groupSize", "spec.learner.loss.miniBatchSize"}),
    (run({"storage": {"size": "10Gi"}, "learner": {"resources": {"gpus": 1}}, "weightTransport": {"type": "nccl"}}), "spec.weightTransport.type"),
    (run({"rollout": {"engine": "vllm", "vllm": {"maxModelLen": 1024}}}), "spec.rollout.vllm.maxModelLen"),
    (run({"rollout": {"engine": "vllm"}, "policy": {"lora": {"rank": 600}}}), "spec.policy.lora.rank"),
    (run({"rollout": {"engine": "vllm", "resources": GPU, "vllm": {"tensorParallelSize": 4}}}), "spec.rollout.vllm.tensorParallelSize"),
    (run({"learner": {"loss": {"miniBatchSize": 4, "microBatchSize": 8}}}), "spec.learner.loss.microBatchSize"),
    # replicas larger than a node: every GPU of the group, vLLM only
    (run({"rollout": {"engine": "vllm", "resources": GPU, "vllm": {"tensorParallelSize": 2, "pipelineParallelSize": 2}}}), "spec.rollout.vllm.tensorParallelSize"),
    (run({"rollout": {"engine": "vllm", "nodesPerReplica": 2, "resources": GPU, "vllm": {"tensorParallelSize": 2}}}), "spec.rollout.vllm.tensorParallelSize"),
    (run({"rollout": {"nodesPerReplica": 2, "resources": GPU}}), "spec.rollout.nodesPerReplica"),
    (run({"rollout": {"engine": "vllm", "nodesPerReplica": 2}}), "spec.rollout.nodesPerReplica"),
    (run({"rollout": {"nodesPerReplica": 17}}), "spec.rollout.nodesPerReplica"),
    (run({"rollout": {"engine": "vllm", "vllm": {"distributedBackend": "slurm"}}}), "spec.rollout.vllm.distributedBackend"),
    (run({"environment": {"executor": {"type": "openai", "serve": {**SERVE, "nodesPerReplica": 2, "resources": {"gpus": 0}}}}}), "spec.environment.executor.serve.nodesPerReplica"),
    (run({"environment": {"executor": {"type": "openai", "serve": {**SERVE, "nodesPerReplica": 2, "resources": {"gpus": 3}, "pipelineParallelSize": 4}}}}), "spec.environment.executor.serve.pipelineParallelSize"),
    (run({"learner": {"loss": {"miniBatchSize": 10000}}}), "spec.learner.loss.miniBatchSize"),
    (run({"learner": {"procsPerNode": 2, "resources": {"gpus": 4}}}), "spec.learner.procsPerNode"),
    (run({"environment": {"data": {"persistentVolumeClaim": "datasets"}}}), "spec.environment.data.dir"),
    # scheduling: tolerations, pod overrides, gang, NCCL
    (run({"scheduling": {"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]}}), "spec.scheduling.tolerations[0].value"),
    (run({"scheduling": {"tolerations": [{"value": "x"}]}}), "spec.scheduling.tolerations[0].operator"),
    (run({"scheduling": {"tolerations": [{"operator": "Exists", "value": "x"}, {"value": "y"}]}}), {"spec.scheduling.tolerations[0].value", "spec.scheduling.tolerations[1].operator"}),
    (run({"scheduling": {"nodeSelector": {"bad key!": "x"}}}), "spec.scheduling.nodeSelector"),
    (run({"scheduling": {"gang": {"scheduleTimeoutSeconds": 0}}}), "spec.scheduling.gang.scheduleTimeoutSeconds"),
    (run({"rollout": {"pod": {"labels": {"aflowrl.io/run": "other"}}}}), "spec.rollout.pod.labels"),
    (run({"learner": {"pod": {"nodeSelector": {"gpu": "a b"}}}}), "spec.learner.pod.nodeSelector.gpu"),
    (run({"rollout": {"pod": {"runtimeClassName": "GVisor"}}}), "spec.rollout.pod.runtimeClassName"),
    (run({"trainer": {"pod": {"tolerations": [{"key": "k", "operator": "Sometimes"}]}}}), "spec.trainer.pod.tolerations[0].operator"),
    (run({"learner": {"pod": {"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]}}}), "spec.learner.pod.topologySpreadConstraints[0].maxSkew"),
    (run({"environment": {"pod": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}]}}}), "spec.environment.pod.topologySpreadConstraints[0].minDomains"),
    (run({"environment": {"pod": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}]}}}), "spec.environment.pod.topologySpreadConstraints[0].whenUnsatisfiable"),
    (run({"trainer": {"pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}}}}), "spec.trainer.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"),
    (run({"learner": {"pod": {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}}}}), "spec.learner.pod.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight"),
    (run({"nccl": {"debug": "LOUD"}}), "spec.nccl.debug"),
    (run({"nccl": {"env": {"PATH": "/x"}}}), "spec.nccl.env"),
    (run({"nccl": {"socketIfname": "eth0; rm -rf /"}}), "spec.nccl.socketIfname"),
    # what the API server refuses in the pods the operator creates from these fields
    (run({"scheduling": {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}]}}), "spec.scheduling.tolerations[0].effect"),
    (run({"learner": {"pod": {"tolerations": [{"key": "k", "operator": "Exists", "tolerationSeconds": 30}]}}}), "spec.learner.pod.tolerations[0].effect"),
    (run({"learner": {"pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["1", "2"]}]}]}}}}}}), "spec.learner.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values"),
    (run({"learner": {"pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Lt", "values": ["many"]}]}]}}}}}}), "spec.learner.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values"),
    (run({"rollout": {"pod": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In"}]}}]}}}}}), "spec.rollout.pod.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].values"),
    (run({"rollout": {"pod": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}}]}}}}}), "spec.rollout.pod.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].preference.matchExpressions[0].values"),
    (run({"trainer": {"pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.labels", "operator": "In", "values": ["a"]}]}]}}}}}}), "spec.trainer.pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchFields"),
    (run({"learner": {"pod": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchExpressions": [{"key": "app", "operator": "NotIn"}]}, "topologyKey": "kubernetes.io/hostname"}]}}}}}), "spec.learner.pod.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].values"),
    (run({"learner": {"pod": {"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone", "matchLabelKeys": ["a"], "mismatchLabelKeys": ["a"]}]}}}}}), "spec.learner.pod.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].mismatchLabelKeys"),
    (run({"scheduling": {"nodeSelector": {".".join(["a" * 60] * 5) + "/gpu": "x"}}}), "spec.scheduling.nodeSelector"),
    (run({"rollout": {"pod": {"labels": {"b" * 254 + "/team": "rl"}}}}), "spec.rollout.pod.labels"),
    (run({"scheduling": {"tolerations": [{"key": "c" * 254 + "/gpu", "operator": "Exists"}]}}), "spec.scheduling.tolerations[0].key"),
    (run({"learner": {"pod": {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "d" * 254 + "/zone", "whenUnsatisfiable": "DoNotSchedule"}]}}}), "spec.learner.pod.topologySpreadConstraints[0].topologyKey"),
    (run({"rollout": {"pod": {"annotations": {f"note-{i}": "x" * 60000 for i in range(5)}}}}), "spec.rollout.pod.annotations"),
    (run({"environment": {"pod": {"annotations": {f"é-{i}": "é" * 30000 for i in range(5)}}}}), "spec.environment.pod.annotations"),
    # ports of one pod, TLS prerequisites
    (run({"rollout": {"port": 9090}}), "spec.rollout.port"),
    (run({"environment": {"port": 9090}}), "spec.environment.port"),
    (run({"monitoring": {"metricsPort": 50053}}), "spec.learner.port"),
    (run({"learner": {"rendezvousPort": 50053}}), "spec.learner.rendezvousPort"),
    (run({"storage": {"size": "10Gi"}, "weightTransport": {"type": "nccl", "port": 29500}}), "spec.weightTransport.port"),
    (run({"storage": {"size": "10Gi"}, "weightTransport": {"type": "nccl", "port": 9090}}), "spec.weightTransport.port"),
    (run({"grpc": {"tlsSecret": "tls", "healthPort": 50052}}), "spec.grpc.healthPort"),
    (run({"grpc": {"tlsSecret": "tls", "healthPort": 9090}}), "spec.grpc.healthPort"),
    (run({"storage": {"size": "10Gi"}, "grpc": {"tlsSecret": "tls", "healthPort": 29601}, "weightTransport": {"type": "nccl", "port": 29601}}), "spec.grpc.healthPort"),
    (run({"grpc": {"mtls": True}}), "spec.grpc.mtls"),
    # paths no file system accepts
    (run({"trainer": {"checkpointDir": "/ck\u0000pt"}}), "spec.trainer.checkpointDir"),
    (run({"trainer": {"checkpointDir": "/checkpoints/" + "r" * 256}}), "spec.trainer.checkpointDir"),
    (run({"trainer": {"checkpointDir": "/" + ("é" * 100 + "/") * 20}}), "spec.trainer.checkpointDir"),
    (run({"environment": {"data": {"dir": "/data/" + "d" * 300}}}), "spec.environment.data.dir"),
    (run({"environment": {"evaluation": {"cachePath": "/tmp/\u0000"}}}), "spec.environment.evaluation.cachePath"),
    (run({"weightTransport": {"type": "nccl", "fallbackPath": "/w/" + "f" * 256}}), "spec.weightTransport.fallbackPath"),
    # rules that hold on a cluster (a TrainingRun document), and the document itself
    (run({"environment": {"benchmarks": ["gsm8k"]}}), "spec.environment.data.dir"),
    (run({"environment": {"heldOutBenchmarks": ["drop"]}}), "spec.environment.data.dir"),
    (run({"environment": {"benchmarks": ["mixed"]}}), "spec.environment.data.dir"),
    (run({"weightTransport": {"type": "filesystem"}}), "spec.storage.size"),
    (run({**FS, "weightTransport": {"type": "filesystem", "path": "/elsewhere/w"}}), "spec.weightTransport.path"),
    (run({"learner": {"nodes": 2}, "storage": {"size": "10Gi"}}), "spec.storage.accessMode"),
    # shared storage: the nccl fallback's directory and a multi-node learner's checkpoint
    (run({"weightTransport": {"type": "nccl"}}), "spec.storage.size"),
    (run({"weightTransport": {"type": "nccl", "fallbackPath": "/elsewhere/w"}, "storage": {"size": "10Gi"}}), "spec.weightTransport.fallbackPath"),
    (run({"weightTransport": {"type": "nccl", "fallbackPath": "/checkpointsX/w"}, "storage": {"size": "10Gi"}}), "spec.weightTransport.fallbackPath"),
    (run({"weightTransport": {"type": "nccl", "fallbackPath": "/w"}}), {"spec.storage.size", "spec.weightTransport.fallbackPath"}),
    (run({"learner": {"nodes": 2}}), "spec.storage.size"),
    (run({"learner": {"nodes": 2}, "weightTransport": {"type": "nccl"}}), "spec.storage.size"),
    (run({}, metadata={"name": "x" * 41}), "metadata.name"),
    (run({}, metadata={"name": "Demo_Run"}), "metadata.name"),
    # a multi-node replica's LeaderWorkerSet <name>-<component>-<index> has at most 50 characters
    (run(multi_rollout(11), metadata={"name": "r" * 40}), "metadata.name"),
    (run({"environment": {"executor": {"type": "openai", "model": "m", "serve": {**SERVE, "nodesPerReplica": 2}}}}, metadata={"name": "e" * 40}), "metadata.name"),
    (run(None), "spec"),
    ({k: v for k, v in run({}).items() if k != "spec"}, "spec"),
    # the trainer's lifecycle on the cluster: bounded, and a TTL only for kept pods
    (run({"trainer": {"activeDeadlineSeconds": 0}}), "spec.trainer.activeDeadlineSeconds"),
    (run({"trainer": {"activeDeadlineSeconds": 10**9}}), "spec.trainer.activeDeadlineSeconds"),
    (run({"trainer": {"keepPodsAfterEnd": True, "ttlSecondsAfterFinished": -1}}), "spec.trainer.ttlSecondsAfterFinished"),
    (run({"trainer": {"keepPodsAfterEnd": True, "ttlSecondsAfterFinished": 10**8}}), "spec.trainer.ttlSecondsAfterFinished"),
    (run({"trainer": {"ttlSecondsAfterFinished": 600}}), "spec.trainer.ttlSecondsAfterFinished"),
    (run({"trainer": {"keepPodsAfterEnd": "yes"}}), "spec.trainer.keepPodsAfterEnd"),
    (run({"environment": {"podDisruptionBudget": {"maxUnavailable": -1}}}), "spec.environment.podDisruptionBudget.maxUnavailable"),
    (run({"environment": {"podDisruptionBudget": {"minAvailable": 1}}}), "spec.environment.podDisruptionBudget.minAvailable"),
]  # fmt: skip

VALID: list[dict] = [
    run({}),
    run(multi_rollout(10), metadata={"name": "r" * 40}),  # ...-rollout-9: 50 characters
    run(multi_rollout(64), metadata={"name": "r" * 39}),  # ...-rollout-63: 50 characters
    run({"environment": {"executor": {"type": "openai", "model": "m", "serve": {**SERVE, "nodesPerReplica": 2}}}}, metadata={"name": "e" * 39}),
    run({"trainer": {"iterations": 5.0}}),  # JSON has one number type: 5.0 is the integer 5
    run({"policy": {"lora": None}, "environment": {"data": None}}),  # null: not set
    run({"rollout": {"engine": "vllm"}, "policy": {"lora": {"rank": 512}}}),
    run({"rollout": {"engine": "vllm"}, "policy": {"lora": {}}}),  # the default rank
    run({"policy": {"lora": {"rank": 600}}}),  # the hf engine serves any rank
    run({"learner": {"optimizer": {"betas": [0, 0.95]}, "algorithm": {"type": "ppo"}}, "environment": {"search": {"selection": "fused", "valueSource": "critic"}}}),
    run({**FS, "learner": {"algorithm": {"type": "grpo", "normByStd": False}}}),
    run({"environment": {"benchmarks": ["gsm8k"], "data": {"dir": "/data", "persistentVolumeClaim": "datasets"}, "executor": {"type": "openai", "baseUrl": "https://api.openai.com/v1", "apiKeySecret": {"name": "openai", "key": "api-key"}}}}),
    run(
        {
            "rollout": {
                "engine": "vllm",
                "resources": {**GPU, "shmSize": "16Gi", "rdma": 1},
                "pod": {
                    "labels": {"team": "rl"},
                    "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
                    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "ScheduleAnyway"}],
                    "priorityClassName": "training",
                },
            },
            "learner": {
                "procsPerNode": 2,
                "resources": {**GPU, "rdma": 1, "rdmaResourceName": "rdma/rdma_shared_device_a"},
                "pod": {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app.kubernetes.io/component": "learner"}}, "topologyKey": "kubernetes.io/hostname"}]}}},
            },
            "environment": {"pod": {"runtimeClassName": "gvisor"}},
            "scheduling": {"gang": {}, "tolerations": [{"operator": "Exists"}]},
            "nccl": {"socketIfname": "^lo,docker", "ibHca": "mlx5", "env": {"NCCL_IB_GID_INDEX": "3"}},
        }
    ),
    run({**DATA, "environment": {**DATA["environment"], "benchmarks": ["mixed"], "heldOutBenchmarks": ["drop"], "benchmarkWeights": {"gsm8k": 2}}}),
    run({"rollout": {"engine": "vllm", "nodesPerReplica": 2, "resources": GPU, "vllm": {"tensorParallelSize": 2, "pipelineParallelSize": 2, "distributedBackend": "ray"}}}),
    run({"rollout": {"engine": "vllm", "resources": {**GPU, "gpus": 8}, "vllm": {"tensorParallelSize": 4, "pipelineParallelSize": 2}}}),
    run({"environment": {"executor": {"type": "openai", "serve": {**SERVE, "nodesPerReplica": 2, "resources": {"gpus": 8}, "pipelineParallelSize": 2}}}}),
    run({"environment": {"evaluation": {"racing": {"enabled": True}}}}),
    run({"policy": {"value": {"enabled": False}}, "environment": {"search": {"selection": "ucb", "valueSource": "none"}}}),
    run({"scheduling": {"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}], "nodeSelector": {"e" * 253 + "/gpu": "x"}}}),
    run({"learner": {"pod": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "gpus", "operator": "Gt", "values": ["3"]}, {"key": "zone", "operator": "DoesNotExist"}], "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}]}}}}}}),
    run({"rollout": {"pod": {"annotations": {f"note-{i}": "x" * 60000 for i in range(4)}}}}),
    run({"grpc": {"tlsSecret": "tls", "mtls": True, "healthPort": 50060}, "weightTransport": {"type": "nccl", "fallbackPath": "/checkpoints/" + "r" * 255 + "/w"}, "trainer": {"checkpointDir": "/checkpoints/" + "r" * 255}, "storage": {"size": "10Gi"}}),
    run({"weightTransport": {"type": "nccl"}, "storage": {"size": "10Gi"}}),
    run({"weightTransport": {"type": "nccl", "fallbackPath": "/ckpt/fallback"}, "trainer": {"checkpointDir": "/ckpt/"}, "storage": {"size": "10Gi"}}),
    run({"learner": {"nodes": 2}, "storage": {"size": "10Gi", "accessMode": "ReadWriteMany"}}),
    run({"trainer": {"activeDeadlineSeconds": 86400, "keepPodsAfterEnd": True, "ttlSecondsAfterFinished": 3600}}),
    run({"trainer": {"keepPodsAfterEnd": True}}),
    run({"environment": {"podDisruptionBudget": {}}}),
    *(yaml.safe_load(p.read_text()) for p in sorted((ROOT / "manifests" / "examples").glob("*.yaml"))),
]  # fmt: skip

# (old spec, new spec, the immutable fields both must name)
UPDATES: list[tuple[dict, dict, set[str]]] = [
    ({}, {"policy": {"model": "/models/b"}}, {"spec.policy.model"}),
    ({}, {"policy": {"lora": {"rank": 8}}}, {"spec.policy.lora"}),
    ({"policy": {"lora": {}}}, {"policy": {"lora": {"rank": 8}}}, {"spec.policy.lora.rank"}),
    ({"policy": {"lora": {}}}, {"policy": {"lora": {"rank": 16}}}, set()),  # the default, spelled
    ({}, {"environment": {"benchmarks": ["humaneval"]}}, set()),
    ({}, {"environment": {"benchmarks": ["mbpp"], "data": {"dir": "/data"}}}, {"spec.environment.benchmarks"}),
    (DATA, {**DATA, "environment": {**DATA["environment"], "heldOutBenchmarks": ["drop"]}}, {"spec.environment.heldOutBenchmarks"}),
    ({}, {"trainer": {"iterations": 99, "seed": 0}}, set()),
    ({}, {"trainer": {"seed": 7}}, {"spec.trainer.seed"}),
    ({}, {"environment": {"executor": {"type": "openai", "baseUrl": "http://x/v1"}}}, {"spec.environment.executor.type"}),
    ({}, {"environment": {"executor": {"type": "surrogate", "seed": 3}}}, {"spec.environment.executor.seed"}),
    ({}, {"storage": {"size": "10Gi"}}, {"spec.storage.size"}),
    ({"storage": {"size": "10Gi"}}, {"storage": {"size": "10Gi", "accessMode": "ReadWriteOnce"}}, set()),
    ({"storage": {"size": "1Ti", "accessMode": "ReadWriteMany"}}, {"learner": {"nodes": 2}, "storage": {"size": "1Ti", "accessMode": "ReadWriteMany"}}, {"spec.learner.nodes"}),
    ({}, FS, {"spec.weightTransport.type", "spec.storage.size"}),
    ({}, {"suspend": True, "rollout": {"replicas": 3}, "environment": {"replicas": {"min": 1, "max": 8}}}, set()),
    ({}, {"learner": {"algorithm": {"type": "grpo"}}}, {"spec.learner.algorithm.type"}),
]  # fmt: skip


def _cli_fields(tmp_path: Path, capsys, doc: dict) -> set[str]:
    """The fields ``aflowrl spec validate -f FILE`` names (empty when it says valid)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    code = main(["spec", "validate", "-f", str(path)])
    err = capsys.readouterr().err
    if code == 0:
        assert "valid" in err
        return set()
    assert code == 2, err
    marker = f"{path}: "
    fields = set()
    for line in err.splitlines():
        if marker in line:
            fields.add(line.split(marker, 1)[1].split(": ", 1)[0])
    assert fields, err
    return fields


def test_the_corpus_is_large_enough():
    assert len(INVALID) >= 50 and len(VALID) >= 8 and len(UPDATES) >= 10
    assert len({json.dumps(doc, sort_keys=True) for doc, _ in INVALID}) == len(INVALID)


@pytest.mark.parametrize(
    ("doc", "field"),
    INVALID,
    ids=[f"{i}-{sorted({f} if isinstance(f, str) else f)[0]}" for i, (_, f) in enumerate(INVALID)],
)
def test_both_refuse_naming_the_same_field(doc, field, tmp_path, capsys):
    fields = {field} if isinstance(field, str) else field
    assert admit(doc) == fields
    assert _cli_fields(tmp_path, capsys, doc) == fields


@pytest.mark.parametrize("doc", VALID, ids=range(len(VALID)))
def test_both_admit(doc, tmp_path, capsys):
    assert admit(doc) == set()
    assert _cli_fields(tmp_path, capsys, doc) == set()


@pytest.mark.parametrize(("old", "new", "fields"), UPDATES, ids=range(len(UPDATES)))
def test_updates_of_immutable_fields_are_refused_by_both(old, new, fields):
    old_doc, new_doc = run(copy.deepcopy(old)), run(copy.deepcopy(new))
    assert admit(old_doc) == set() and admit(new_doc) == set()
    assert admit(new_doc, old=old_doc) == fields
    found = immutable_changes(RunSpec.from_document(old_doc), RunSpec.from_document(new_doc))
    assert {path for path, _ in found} == fields
