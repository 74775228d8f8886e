"""The engine arguments the vllm backend derives from a run spec."""

from __future__ import annotations

import pytest

from aflowrl.config.rollout import VLLM_LORA_RANKS
from aflowrl.group import vllm_lora_rank


def test_the_lora_rank_is_rounded_up_to_one_vllm_takes():
    """vLLM 0.32 refuses ``max_lora_rank=4`` at start (its field is a literal of the values in
    VLLM_LORA_RANKS); an engine for rank r gets the smallest allowed value of at least r."""
    assert [vllm_lora_rank(r) for r in (1, 2, 4, 8, 9, 16, 48, 64, 300, 320, 321, 512)] == [
        1, 8, 8, 8, 16, 16, 64, 64, 320, 320, 512, 512,
    ]  # fmt: skip
    assert all(vllm_lora_rank(r) in VLLM_LORA_RANKS for r in range(1, 513))
    assert all(vllm_lora_rank(r) >= r for r in range(1, 513))
    with pytest.raises(ValueError, match="above 512"):
        vllm_lora_rank(513)
