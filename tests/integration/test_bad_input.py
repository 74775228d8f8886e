"""Bad input to every RPC of the three services, and to the CLI: a clear refusal, no traceback.

Each service is a real process started as the local launcher starts it (the environment with the
surrogate executor on AFlow's GSM8K split files; the rollout and the learner with the tiny model),
with ``grpc.maxMessageMib`` 4 so an over-size message is cheap to send. Every RPC, found from the
service descriptors so a new one is covered too, gets bytes that are not protobuf, a truncated
message and groups nested 100 000 deep (INVALID_ARGUMENT naming the method), and a message over
the size limit (RESOURCE_EXHAUSTED). The fields that take documents or paths get nested,
repeated-key, over-size and unusable ones (INVALID_ARGUMENT naming the field; NOT_FOUND for a path
that is well formed but absent). Once the service has stopped, its log must hold no traceback.

No assertion is about time: each call carries a generous deadline, which only detects a hang.
The CLI commands that read run files and workflows must exit 2 naming the file and the line.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
import subprocess
import sys
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message
from grpc import aio

from aflowrl._proto.v1 import common_pb2, environment_pb2, learner_pb2, rollout_pb2
from aflowrl.envsvc import blob
from aflowrl.workflow import library

sys.path.insert(0, str(Path(__file__).parent))
from policy_services import SPEC, Service, start_service

DEADLINE_S = 120.0
"""Deadline of every call: a hang detector, far above what any refusal takes."""
MAX_MESSAGE_MIB = 4

NOT_PROTOBUF = b"\xff" * 32
TRUNCATED = b"\x0a\x40" + b"x" * 10  # field 1, 64 bytes announced, 10 sent
NESTED_GROUPS = b"\x7b" * 100_000  # start-group of field 15, 100 000 times
OVERSIZED = b"\x0a\x80\x80\x80\x03" + b"x" * (6 << 20)  # field 1 of 6 MiB, over the 4 MiB limit

DEEP_JSON = "[" * 100_000 + "]" * 100_000
REPEATED_KEY_JSON = '{\n"name": "a",\n"name": "b"\n}'


def _descriptor(module) -> ServiceDescriptor:
    [service] = module.DESCRIPTOR.services_by_name.values()
    return service


def _path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


async def _single(item: bytes) -> AsyncIterator[bytes]:
    yield item


async def _call(
    channel: aio.Channel, method: MethodDescriptor, payload: bytes
) -> tuple[grpc.StatusCode, str]:
    """Send raw bytes to ``method`` (any streaming shape); (status code, details), OK included."""
    path = _path(method)
    try:
        if method.client_streaming:
            await channel.stream_unary(path)(_single(payload), timeout=DEADLINE_S)
        elif method.server_streaming:
            async for _ in channel.unary_stream(path)(payload, timeout=DEADLINE_S):
                pass
        else:
            await channel.unary_unary(path)(payload, timeout=DEADLINE_S)
    except aio.AioRpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


async def _refused(
    channel: aio.Channel,
    service: ServiceDescriptor,
    name: str,
    request: Message,
    *,
    names: str,
    code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
) -> str:
    """Details of the answer to ``request``, which must be ``code`` and name ``names``."""
    got, details = await _call(channel, service.methods_by_name[name], request.SerializeToString())
    assert got == code, (name, got, details)
    assert names in details, (name, details)
    return details


async def _fuzz_every_method(service: Service, descriptor: ServiceDescriptor) -> None:
    """The four malformed payloads to every method of ``descriptor``."""
    async with aio.insecure_channel(service.target) as channel:
        for method in descriptor.methods:
            for payload in (NOT_PROTOBUF, TRUNCATED, NESTED_GROUPS):
                code, details = await _call(channel, method, payload)
                assert code == grpc.StatusCode.INVALID_ARGUMENT, (method.name, code, details)
                assert _path(method) in details and "does not parse" in details, details
            code, details = await _call(channel, method, OVERSIZED)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (method.name, code, details)


def _stopped_without_traceback(service: Service) -> None:
    assert service.stop() == 0, service.log.read_text()[-3000:]
    log = service.log.read_text()
    assert "Traceback" not in log, log[log.index("Traceback") - 200 :][:4000]


@pytest.fixture
def spec_file(tmp_path: Path, aflow_data: Path) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(
        SPEC
        + f"trainer: {{checkpointDir: {tmp_path / 'checkpoints'}}}\n"
        + f"grpc: {{maxMessageMib: {MAX_MESSAGE_MIB}}}\n"
        + "environment:\n"
        + "  benchmarks: [gsm8k]\n"
        + f"  data: {{dir: {aflow_data}}}\n"
        + "  executor: {type: surrogate}\n"
        + "  evaluation: {maxProblems: 2, repeats: 1}\n"
        + "  search: {maxSteps: 2, selection: ucb, valueSource: none}\n"
    )
    return path


@pytest.fixture
def started(spec_file: Path, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Service]:
    service = start_service(request.param, spec_file, tmp_path, timeout=600)
    try:
        yield service
    finally:
        service.stop()


def _state_blob(payload: bytes) -> bytes:
    """A blob in the documented layout, MAC'd with the public key (no token configured)."""
    compressed = zlib.compress(payload)
    header = struct.pack(">3sBI", blob.MAGIC, blob.FORMAT_VERSION, len(compressed))
    mac = hmac.new(blob.derive_key(None), header + compressed, hashlib.sha256).digest()
    return header + mac + compressed


# ------------------------------------------------------------------------------ environment


@pytest.mark.parametrize("started", ["env"], indirect=True)
async def test_environment_refuses_bad_input_on_every_rpc(started: Service):
    descriptor = _descriptor(environment_pb2)
    await _fuzz_every_method(started, descriptor)
    pb = environment_pb2
    seed = library.load("seed", "math").to_json(indent=None)
    async with aio.insecure_channel(started.target) as channel:

        async def refused(name: str, request: Message, names: str, **kw) -> str:
            return await _refused(channel, descriptor, name, request, names=names, **kw)

        for text, why in [
            (DEEP_JSON, "nested deeper than 64 levels"),
            (REPEATED_KEY_JSON, "line 3: duplicate key 'name' (first on line 2)"),
            ("1" * 5000, "not JSON"),
            ("[" + " " * (2 << 20) + "]", "characters; at most"),
        ]:
            details = await refused(
                "Reset",
                pb.ResetRequest(task="gsm8k", seed_workflow_json=text),
                "seed_workflow_json",
            )
            assert why in details
            details = await refused(
                "Evaluate",
                pb.EvaluateRequest(workflow_json=text, benchmark="gsm8k", split="validate"),
                "evaluate.workflow_json",
            )
            assert why in details
        nan = float("nan")
        await refused(
            "Reset",
            pb.ResetRequest(task="gsm8k", values=pb.StateValues(default_value=nan)),
            "reset.values.default_value",
        )
        for payload, why in [
            (DEEP_JSON.encode(), "nested deeper than 64 levels"),
            (b'{"version": 1, "version": 1}', "duplicate key 'version'"),
            (b"\xff\xfe", "not UTF-8"),
        ]:
            state = _state_blob(payload)
            assert why in await refused(
                "Step", pb.StepRequest(state=state, action="1"), "step.state"
            )
            assert why in await refused(
                "Project", pb.ProjectRequest(state=state, action="1"), "project.state"
            )
        await refused("Step", pb.StepRequest(state=b"AFE\x01" + b"\0" * 40), "step.state")
        # A policy's free-form action is never an error: an invalid action (no-op, penalty).
        stub_reset = channel.unary_unary(
            _path(descriptor.methods_by_name["Reset"]),
            request_serializer=pb.ResetRequest.SerializeToString,
            response_deserializer=pb.ResetResponse.FromString,
        )
        reset = await stub_reset(
            pb.ResetRequest(
                task="gsm8k", seed_workflow_json=seed, action_mode=pb.ACTION_MODE_FREEFORM
            ),
            timeout=DEADLINE_S,
        )
        stub_step = channel.unary_unary(
            _path(descriptor.methods_by_name["Step"]),
            request_serializer=pb.StepRequest.SerializeToString,
            response_deserializer=pb.StepResponse.FromString,
        )
        for action, why in [
            ('<action>{"nodes": ' + "[" * 5000 + "]" * 5000 + "}</action>", "nested deeper"),
            (f"<action>{REPEATED_KEY_JSON}</action>", "duplicate key 'name'"),
            ("<action>{" + " " * 100_000 + "}</action>", "characters long"),
        ]:
            step = await stub_step(pb.StepRequest(state=reset.state, action=action), timeout=600)
            assert not step.info.valid_action and why in step.info.invalid_reason, step.info
    _stopped_without_traceback(started)


# ---------------------------------------------------------------------------------- rollout


@pytest.mark.parametrize("started", ["rollout"], indirect=True)
async def test_rollout_refuses_bad_input_on_every_rpc(started: Service, tmp_path: Path):
    descriptor = _descriptor(rollout_pb2)
    await _fuzz_every_method(started, descriptor)
    pb = rollout_pb2

    def chat(text: str) -> common_pb2.Prompt:
        message = common_pb2.ChatMessage(role="user", content=text)
        return common_pb2.Prompt(chat=common_pb2.ChatMessages(messages=[message]))

    async with aio.insecure_channel(started.target) as channel:

        async def refused(name: str, request: Message, names: str, **kw) -> str:
            return await _refused(channel, descriptor, name, request, names=names, **kw)

        huge = "word " * 700_000  # more characters than the tiny model's positions can hold
        await refused(
            "Generate",
            pb.GenerateRequest(prompts=[common_pb2.Prompt(text=huge)]),
            "prompts[0].text",
        )
        await refused("Generate", pb.GenerateRequest(prompts=[chat(huge)]), "prompts[0].chat")
        for sampling, name in [
            (pb.SamplingParams(temperature=float("nan")), "sampling.temperature"),
            (pb.SamplingParams(top_p=float("nan")), "sampling.top_p"),
            (pb.SamplingParams(max_tokens=2**31 - 1), "prompts[0]"),
            (pb.SamplingParams(n=1_000_000), "sampling.n"),
        ]:
            await refused(
                "Generate", pb.GenerateRequest(prompts=[chat("hi")], sampling=sampling), name
            )
        ids = common_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=[-1, 2**31 - 1]))
        await refused("Generate", pb.GenerateRequest(prompts=[ids]), "prompts[0].token_ids")
        await refused(
            "ScoreCandidates",
            pb.ScoreCandidatesRequest(
                items=[pb.CandidateSet(prompt=chat("hi"), candidates=[huge])]
            ),
            "items[0].candidates[0]",
        )
        for path in ["/tmp/a\0b", "/tmp/" + "a" * 300, "/" + "a/" * 3000, ""]:
            await refused("LoadWeights", pb.LoadWeightsRequest(path=path, version=9), "path")
        (tmp_path / "marker-only").mkdir()
        (tmp_path / "marker-only" / "aflowrl-weights.json").write_text(DEEP_JSON)
        await refused(
            "LoadWeights",
            pb.LoadWeightsRequest(path=str(tmp_path / "marker-only"), version=9),
            "nested deeper",
        )
        (tmp_path / "marker-only" / "aflowrl-weights.json").write_text('{"version": "9"}')
        await refused(
            "LoadWeights",
            pb.LoadWeightsRequest(path=str(tmp_path / "marker-only"), version=9),
            "is not a weights marker",
        )
        await refused(
            "LoadWeights",
            pb.LoadWeightsRequest(path=str(tmp_path / "absent"), version=9),
            "path",
            code=grpc.StatusCode.NOT_FOUND,
        )
        # A weight stream whose manifest does not fit the model: refused, nothing swapped.
        manifest = common_pb2.WeightManifest(
            version=9,
            tensors=[common_pb2.TensorMeta(name="x", dtype="float32", shape=[2**40], nbytes=-1)],
        )
        code, details = await _call(
            channel,
            descriptor.methods_by_name["UpdateWeights"],
            common_pb2.WeightChunk(manifest=manifest).SerializeToString(),
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "manifest" in details, details
    _stopped_without_traceback(started)


# ---------------------------------------------------------------------------------- learner


@pytest.mark.parametrize("started", ["learner"], indirect=True)
async def test_learner_refuses_bad_input_on_every_rpc(started: Service, tmp_path: Path):
    descriptor = _descriptor(learner_pb2)
    await _fuzz_every_method(started, descriptor)
    pb = learner_pb2
    async with aio.insecure_channel(started.target) as channel:

        async def refused(name: str, request: Message, names: str, **kw) -> str:
            return await _refused(channel, descriptor, name, request, names=names, **kw)

        out_of_vocab = pb.Sequence(prompt_token_ids=[1], response_token_ids=[2**31 - 1])
        await refused(
            "ComputeLogProbs",
            pb.ComputeLogProbsRequest(sequences=[out_of_vocab]),
            "sequences[0].response_token_ids",
        )
        too_long = pb.Sequence(prompt_token_ids=[1] * 100_000, response_token_ids=[1])
        await refused(
            "ComputeLogProbs", pb.ComputeLogProbsRequest(sequences=[too_long]), "sequences[0]"
        )
        sample = pb.TrainSample(
            sequence=pb.Sequence(prompt_token_ids=[1], response_token_ids=[2]),
            old_logprobs=[float("nan")],
            advantages=[1.0],
        )
        await refused("Train", pb.TrainRequest(samples=[sample]), "samples[0].old_logprobs")
        a_file = tmp_path / "a-file"
        a_file.write_text("not a directory")
        for path in ["/tmp/a\0b", "/tmp/" + "a" * 300, "/" + "a/" * 3000, ""]:
            await refused("SaveCheckpoint", pb.SaveCheckpointRequest(path=path), "path")
            await refused("LoadCheckpoint", pb.LoadCheckpointRequest(path=path), "path")
            if path:  # empty: the transport's own directory
                await refused("ExportWeights", pb.ExportWeightsRequest(path=path), "path")
        unwritable = f"{a_file}/x"  # a file in the way
        details = await refused("SaveCheckpoint", pb.SaveCheckpointRequest(path=unwritable), "path")
        assert "cannot create directory" in details
        await refused("ExportWeights", pb.ExportWeightsRequest(path=unwritable), "path")
        for absent in [unwritable, str(tmp_path / "absent")]:
            await refused(
                "LoadCheckpoint",
                pb.LoadCheckpointRequest(path=absent),
                "path",
                code=grpc.StatusCode.NOT_FOUND,
            )
        target = ["127.0.0.1:1"]  # never dialled: the request is refused before
        await refused("PushWeights", pb.PushWeightsRequest(targets=target, dtype="x" * 9), "dtype")
        await refused(
            "PushWeights", pb.PushWeightsRequest(targets=target, chunk_bytes=-1), "chunk_bytes"
        )
    _stopped_without_traceback(started)


# -------------------------------------------------------------------------------------- CLI


def _alias_bomb() -> str:
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join(lines) + "\n"


RUN_FILES = {
    "deep.yaml": ("policy: " + "[" * 5000 + "]" * 5000 + "\n", "line 1", "nest"),
    "deep-block.yaml": (
        "policy:\n" + "".join("  " * i + "- \n" for i in range(1, 200)),
        "line ",
        "nested deeper than 64 levels",
    ),
    "bomb.yaml": (_alias_bomb(), "line 2", "YAML aliases are not accepted"),
    "repeated.yaml": (
        "policy:\n  dtype: float32\ntrainer: {}\npolicy: {}\n",
        "line 4",
        "duplicate key 'policy' (first on line 1)",
    ),
    "repeated.json": (
        '{"policy": {"dtype": "float32",\n "dtype": "bfloat16"}}',
        "line 2",
        "duplicate key 'dtype' (first on line 1)",
    ),
    "huge.yaml": ("a: " + "b" * (2 << 20) + "\n", "", "larger than 1048576 bytes"),
    "binary.yaml": (b"\xff\xfe\x00policy", "", "not UTF-8 text"),
}


def _aflowrl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aflowrl", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(RUN_FILES))
def test_run_file_commands_exit_2_naming_file_and_line(tmp_path: Path, name: str):
    content, line, why = RUN_FILES[name]
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    for command in (
        ["spec", "validate", "-f", str(path)],
        ["train", "-f", str(path), "--run-dir", str(tmp_path / "run")],
        ["optimize", "--benchmark", "gsm8k", "--executor", "surrogate", "-f", str(path)],
    ):
        done = _aflowrl(*command)
        assert done.returncode == 2, (command, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert str(path) in done.stderr and line in done.stderr and why in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()  # nothing started


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (DEEP_JSON, "line 1: nested deeper than 64 levels"),
        (REPEATED_KEY_JSON, "line 3: duplicate key 'name' (first on line 2)"),
        ("{" * 3, "not JSON"),
        ('{"nodes": []}', "nodes: must be a non-empty list of nodes"),
        ("[1, 2]", "a workflow must be a JSON object"),
    ],
)
def test_eval_workflow_file_exits_2_naming_file_and_line(tmp_path: Path, content: str, why: str):
    path = tmp_path / "workflow.json"
    path.write_text(content)
    done = _aflowrl(
        "eval", "--workflow", str(path), "--benchmark", "gsm8k", "--executor", "surrogate"
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert str(path) in done.stderr and why in done.stderr, done.stderr
