"""Generated gRPC code is generated: the committed files equal a fresh run of the script."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load_codegen():
    spec = importlib.util.spec_from_file_location("run_codegen", ROOT / "protos" / "run_codegen.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_codegen"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_not_stale(tmp_path):
    codegen = _load_codegen()
    codegen.generate(tmp_path / "_proto")
    committed = ROOT / "services" / "aflowrl" / "_proto"
    fresh = {
        p.relative_to(tmp_path / "_proto"): p.read_text()
        for p in (tmp_path / "_proto").rglob("*")
        if p.is_file()
    }
    current = {
        p.relative_to(committed): p.read_text()
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert sorted(fresh) == sorted(current), "files differ: run `make proto` and commit"
    stale = [str(name) for name, text in fresh.items() if current[name] != text]
    assert not stale, f"stale generated files (run `make proto`): {stale}"


def test_generated_modules_import_under_the_private_package():
    from aflowrl._proto.v1 import environment_pb2, environment_pb2_grpc, learner_pb2, rollout_pb2

    assert environment_pb2.DESCRIPTOR.name == "aflowrl/v1/environment.proto"
    assert environment_pb2.StepRequest.__module__ == "aflowrl._proto.v1.environment_pb2"
    assert hasattr(environment_pb2_grpc, "EnvironmentServiceServicer")
    assert (
        "UpdateWeights" in rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].methods_by_name
    )
    learner = learner_pb2.DESCRIPTOR.services_by_name["LearnerService"]
    assert "PushWeights" in learner.methods_by_name


def _undocumented(text: str) -> list[str]:
    """Fields and rpcs with no comment above them.

    A field may share the comment of the field right above it (one comment for a group such as
    ``prompt_tokens`` / ``completion_tokens``), and a field whose name is its message type's name
    (``Observation observation = 2;``) is documented by that message.
    """
    found = []
    documented_previous = False
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        is_rpc = stripped.startswith("rpc ")
        is_field = (
            stripped.endswith(";")
            and " = " in stripped
            and not stripped.startswith(("//", "option ", "syntax ", "package ", "import "))
            and not stripped.split()[0].isupper()  # enum values are documented by the enum
        )
        if not (is_rpc or is_field):
            documented_previous = stripped.startswith("//")
            continue
        words = stripped.removeprefix("repeated ").removeprefix("optional ").split()
        self_describing = is_field and words[1].replace("_", "") == words[0].lower()
        ok = documented_previous or self_describing
        if not ok:
            found.append(f"{number}: {stripped}")
        documented_previous = ok
    return found


def test_every_proto_field_and_rpc_is_documented():
    problems = {
        proto.name: _undocumented(proto.read_text())
        for proto in sorted((ROOT / "protos" / "aflowrl" / "v1").glob("*.proto"))
    }
    assert not any(problems.values()), problems


def test_the_documentation_check_catches_a_bare_field():
    text = "message M {\n  // documented\n  int32 a = 1;\n\n  int32 b = 2;\n}\n"
    assert _undocumented(text) == ["5: int32 b = 2;"]
