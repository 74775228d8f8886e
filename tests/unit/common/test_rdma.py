"""RDMA asked for but absent is said at start-up, not discovered as slow NCCL over sockets."""

from __future__ import annotations

import pytest

from aflowrl.cli import main
from aflowrl.common import rdma
from aflowrl.errors import FailedPreconditionError


def test_rdma_asked_for_without_a_device_stops_with_the_field_named(tmp_path):
    assert rdma.check(0, tmp_path / "infiniband") == []  # not asked: nothing to check
    with pytest.raises(FailedPreconditionError, match=r"resources\.rdma=1 .*RdmaUnavailable"):
        rdma.check(1, tmp_path / "infiniband")
    devices = tmp_path / "infiniband"
    devices.mkdir()
    (devices / "rdma_cm").touch()
    with pytest.raises(FailedPreconditionError):
        rdma.check(1, devices)  # the connection manager alone is no verbs device
    (devices / "uverbs0").touch()
    assert rdma.check(1, devices) == ["uverbs0"]


def test_serve_refuses_to_start_without_the_rdma_it_was_given(monkeypatch, capsys):
    if rdma.devices():
        pytest.skip("this machine has RDMA devices")
    monkeypatch.setenv("AFLOWRL_RDMA_DEVICES", "2")
    assert main(["serve", "learner"]) == 2
    assert "resources.rdma=2 but no RDMA device" in capsys.readouterr().err
