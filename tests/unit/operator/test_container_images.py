"""The Dockerfiles: non-root users, the project's entry points, and no torch in the slim image.

No container engine runs here, so this reads the files (the images are built by CI/release).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from aflowrl_operator.pods import RUN_AS

ROOT = Path(__file__).resolve().parents[3]
DOCKER = ROOT / "docker"
SCRIPTS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def _final_stage(name: str) -> list[str]:
    lines = (DOCKER / name).read_text().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("FROM ")]
    return lines[starts[-1] :]


def _installed_extras(name: str) -> set[str]:
    stage = "\n".join(_final_stage(name))
    (extras,) = re.findall(r'"aflow-rl\[([a-z,]+)\]"', stage)
    return set(extras.split(","))


@pytest.mark.parametrize(
    "name", ["operator.Dockerfile", "env.Dockerfile", "gpu.Dockerfile", "cpu.Dockerfile"]
)
def test_images_run_as_the_pods_non_root_user_and_the_project_entry_point(name):
    stage = _final_stage(name)
    users = [line.split()[1] for line in stage if line.startswith("USER ")]
    assert users == [f"{RUN_AS}:{RUN_AS}"]  # the uid the operator's pods run as
    (entry,) = [line for line in stage if line.startswith("ENTRYPOINT ")]
    command = json.loads(entry.removeprefix("ENTRYPOINT "))
    assert command[0] in SCRIPTS
    assert any("PYTHONDONTWRITEBYTECODE=1" in line for line in stage)  # read-only root


def test_the_slim_image_has_no_torch_and_the_gpu_image_has_it():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    slim = _installed_extras("env.Dockerfile")
    assert slim == {"env", "tracking"}  # the trainer's experiment trackers too
    assert not any(req.startswith(("torch", "vllm")) for extra in slim for req in extras[extra])
    assert {"learner", "rollout"} <= _installed_extras("gpu.Dockerfile")
    assert _installed_extras("operator.Dockerfile") == {"operator"}


def test_the_cpu_image_has_torch_from_the_cpu_index_and_no_vllm():
    extras = _installed_extras("cpu.Dockerfile")
    assert {"learner", "rollout"} <= extras and "vllm" not in extras
    text = (DOCKER / "cpu.Dockerfile").read_text()
    assert "https://download.pytorch.org/whl/cpu" in text and "--extra-index-url" in text


def test_make_images_builds_every_dockerfile_and_kind_load_loads_them():
    makefile = (ROOT / "Makefile").read_text()
    (line,) = [line for line in makefile.splitlines() if line.startswith("IMAGES :=")]
    built = set(line.split(":=")[1].split())
    assert {f"{name}.Dockerfile" for name in built} == {p.name for p in DOCKER.glob("*.Dockerfile")}
    assert "kind load docker-image" in makefile


def test_the_build_context_leaves_out_environments_and_history():
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert {".git", ".venv"} <= set(ignored)
