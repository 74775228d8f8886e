"""Which dtype the learner holds a LoRA policy's frozen base in (``policy.lora.baseDtype``)."""

from __future__ import annotations

import pytest
import torch

from aflowrl.config import RunSpec
from aflowrl.learner.policy import frozen_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def _spec(policy: dict) -> RunSpec:
    return RunSpec.from_document({"policy": policy})


@pytest.mark.parametrize(
    ("policy", "device", "bf16_gpu", "expected"),
    [
        # auto: bfloat16 on a GPU that has it, else the parameter dtype (float32 by default)
        ({"lora": {}}, CUDA, True, torch.bfloat16),
        ({"lora": {}}, CUDA, False, torch.float32),
        ({"lora": {}}, CPU, False, torch.float32),
        ({"dtype": "float16", "lora": {}}, CPU, False, torch.float16),
        # asked for: on any device
        ({"lora": {"baseDtype": "bfloat16"}}, CPU, False, torch.bfloat16),
        ({"lora": {"baseDtype": "float32"}}, CUDA, True, torch.float32),
        # without LoRA every weight trains: nothing is frozen apart from the parameter dtype
        ({}, CUDA, True, torch.float32),
        ({"dtype": "bfloat16"}, CPU, False, torch.bfloat16),
    ],
)
def test_the_frozen_base_dtype(policy, device, bf16_gpu, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_gpu)
    assert frozen_dtype(_spec(policy), device) == expected


def test_a_base_dtype_outside_the_list_is_refused_naming_the_field():
    from aflowrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"spec\.policy\.lora\.baseDtype"):
        RunSpec.from_document({"policy": {"lora": {"baseDtype": "int8"}}})
