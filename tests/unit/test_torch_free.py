"""The environment service's image has no torch: everything it imports must work without it.

Add modules here as they appear (environment service, search, workflow, benchmarks, executor,
sandbox, trainer). The check imports them in a fresh interpreter where ``import torch`` fails.
"""

from __future__ import annotations

import subprocess
import sys

TORCH_FREE_MODULES = [
    "aflowrl.config",
    "aflowrl.config.crd",
    "aflowrl.common.server",
    "aflowrl.common.client",
    "aflowrl.cli",
    "aflowrl.benchmarks.base",
    "aflowrl.executor.base",
    "aflowrl.workflow",
    "aflowrl.workflow.evaluator",
    "aflowrl.workflow.picture",
    "aflowrl.cli.eval",
    "aflowrl.sandbox",
    "aflowrl.rl.gigpo",
    "aflowrl.rl.grpo",
    "aflowrl.rl.gae",
    "aflowrl.rl.kl",
    "aflowrl.rl.rewards",
    "aflowrl.benchmarks",
    "aflowrl.benchmarks.gsm8k",
    "aflowrl.benchmarks.competition_math",
    "aflowrl.benchmarks.hotpotqa",
    "aflowrl.benchmarks.drop",
    "aflowrl.benchmarks.humaneval",
    "aflowrl.benchmarks.mbpp",
    "aflowrl.executor",
    "aflowrl.executor.openai",
    "aflowrl.executor.pricing",
    "aflowrl.common.run_status",
    "aflowrl.trainer.weight_sync",
    "aflowrl.trainer.app",
    "aflowrl.trainer.loop",
    "aflowrl.trainer.plots",
    "aflowrl.trainer.tracking",
    "aflowrl.trainer.trees",
    "aflowrl.cli.plot",
    "aflowrl.cli.show",
    "aflowrl.local.launcher",
    "aflowrl.local.preflight",
    "aflowrl.local.run",
    "aflowrl.cli.train",
    "aflowrl.models.transport",
    "aflowrl.search",
    "aflowrl.search.optimize",
    "aflowrl.search.proposers",
    "aflowrl.cli.optimize",
    "aflowrl.envsvc",
    "aflowrl.envsvc.server",
    "aflowrl.envsvc.service",
    "aflowrl.envsvc.executors",
    "aflowrl.executor.surrogate",
    "aflowrl.executor.surrogate.server",
    "aflowrl.cli.surrogate_calibration",
    "aflowrl.cli.surrogate",
]

_BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'transformers', 'vllm'}:
            raise ImportError(f'{name} is not installed in the environment image')
sys.meta_path.insert(0, Block())
"""


def test_environment_side_modules_import_without_torch():
    code = _BLOCKER + "".join(f"import {m}\n" for m in TORCH_FREE_MODULES)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_the_trainer_writes_tensorboard_events_without_torch(tmp_path):
    code = _BLOCKER + (
        "from pathlib import Path\n"
        "from aflowrl.config import RunSpec\n"
        "from aflowrl.trainer import tracking\n"
        f"with tracking.open_trackers(RunSpec(), Path({str(tmp_path)!r})) as t:\n"
        "    t.log(0, {'charts/best_score': 0.5})\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_the_blocker_blocks():
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKER + "import torch\n"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "not installed" in result.stderr
