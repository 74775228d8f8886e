"""Shared pytest configuration: source roots importable, no developer caches or secrets."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Tests never read the developer's own cache or secrets.
os.environ.setdefault("AFLOWRL_CACHE_DIR", str(ROOT / ".pytest_cache" / "aflowrl"))
for _name in (
    "AFLOWRL_EXECUTOR_API_KEY",
    "OPENAI_API_KEY",
    "AFLOWRL_AUTH_TOKEN_FILE",
    "AFLOWRL_TLS_DIR",
    "AFLOWRL_TLS_CLIENT_DIR",
    "WANDB_API_KEY",
    "WANDB_API_KEY_FILE",
    "MLFLOW_TRACKING_URI",
):
    os.environ.pop(_name, None)
# Experiment trackers never reach a network from tests (the specs ask for offline W&B too).
os.environ["WANDB_MODE"] = "offline"

if str(ROOT / "services") not in sys.path:  # running without an editable install
    sys.path.insert(0, str(ROOT / "services"))
if str(ROOT / "charts") not in sys.path:  # the chart's renderer and RBAC (chart_rbac.py)
    sys.path.insert(0, str(ROOT / "charts"))


def find_aflow_data() -> Path | None:
    """AFlow's split files: $AFLOWRL_DATA_DIR, else ``shared/datasets/aflow`` above the checkout."""
    configured = os.environ.get("AFLOWRL_DATA_DIR")
    if configured and (Path(configured) / "gsm8k_test.jsonl").is_file():
        return Path(configured)
    for parent in ROOT.parents:
        candidate = parent / "shared" / "datasets" / "aflow"
        if (candidate / "gsm8k_test.jsonl").is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def aflow_data() -> Path:
    """The real AFlow split files (read-only); tests that need them skip without them."""
    found = find_aflow_data()
    if found is None:
        pytest.skip("AFlow split files not found: set AFLOWRL_DATA_DIR (../shared/datasets/aflow)")
    return found
