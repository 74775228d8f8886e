"""Every component's metric catalogue builds, follows the naming rule and has process metrics."""

from __future__ import annotations

import pytest

from aflowrl.common.metrics import exported_metric_names
from aflowrl.envsvc.metrics import EnvironmentMetrics
from aflowrl.learner.metrics import LearnerMetrics
from aflowrl.rollout.metrics import RolloutMetrics
from aflowrl.trainer.metrics import TrainerMetrics


@pytest.mark.parametrize(
    "factory", [EnvironmentMetrics, RolloutMetrics, LearnerMetrics, TrainerMetrics]
)
def test_catalogue_builds_in_its_own_registry(factory):
    first, second = factory(), factory()  # separate registries: no duplicate-name clash
    names = exported_metric_names(first.registry)
    own = {name for name in names if not name.startswith(("process_", "python_"))}
    assert own and all(name.startswith(f"aflowrl_{first.component}_") for name in own)
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes"} <= names
    # The label catalogue names what is exported (a counter's family drops its "_total").
    assert {name.removesuffix("_total") for name in first.label_names} <= names
    assert exported_metric_names(second.registry) == names
