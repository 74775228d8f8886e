"""Benchmark tests: AFlow's split files, found as every test finds them (tests/conftest.py:
``$AFLOWRL_DATA_DIR``, else ``shared/datasets/aflow`` above the checkout)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def aflow_data_dir(aflow_data: Path) -> Path:
    """The real AFlow split files (read-only)."""
    return aflow_data
