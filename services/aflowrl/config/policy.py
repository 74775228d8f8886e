"""The policy model: which LLM learns to propose workflow edits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from aflowrl.config._base import DnsLabel, SpecModel

TINY_MODEL = "tiny"
"""Reserved model name: the tiny Qwen2-architecture model built locally on first use."""


class LoraSpec(SpecModel):
    """Low-rank adapters (peft) for large policies; the base weights stay frozen."""

    rank: int = Field(default=16, ge=1, le=1024)
    """Adapter rank r."""
    alpha: float = Field(default=32.0, gt=0.0, le=4096.0)
    """Scaling numerator (the update is scaled by alpha / r)."""
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter input."""
    target_modules: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
        min_length=1,
        max_length=64,
    )
    """Names of the linear modules that get adapters."""


class PolicySpec(SpecModel):
    """The model trained by RL."""

    model: str = Field(default=TINY_MODEL, min_length=1, max_length=1024)
    """Hugging Face model directory (e.g. a mounted "/models/Qwen2.5-7B-Instruct"), or "tiny" for
    the built-in tiny Qwen2 model. Nothing is downloaded from a hub."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Parameter dtype; "auto" is bfloat16 on GPU and float32 on CPU."""
    max_prompt_tokens: int = Field(default=3072, ge=64, le=131072)
    """Longest observation prompt in tokens; longer observations are cut by the environment."""
    max_response_tokens: int = Field(default=256, ge=1, le=32768)
    """Longest policy response in tokens."""
    trust_remote_code: bool = False
    """Allow model code from the model directory (off: only architectures transformers ships)."""
    lora: LoraSpec | None = None
    """Train LoRA adapters instead of all weights (recommended from 7B parameters up)."""
    reference_model: str | None = Field(default=None, max_length=1024)
    """Frozen reference model for the KL term; empty = the initial policy weights."""
    persistent_volume_claim: DnsLabel | None = None
    """On Kubernetes: a PVC holding the model directories, mounted read-only at /models in the
    rollout, learner and trainer pods (``model: /models/Qwen2.5-7B-Instruct``); empty: the model
    is inside the image (or "tiny", built on first use)."""
