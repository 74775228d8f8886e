"""The policy model: which LLM learns to propose workflow edits."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from aflowrl.config._base import DnsLabel, SpecModel

TINY_MODEL = "tiny"
"""Reserved model name: the tiny Qwen2-architecture model built locally on first use."""
BUILT_IN_MODELS = ("tiny", "small", "base")
"""Reserved model names: the project-built presets (aflowrl.models.builtin), fastest first."""


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
    base_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype of the frozen base weights in the learner (the adapters, the only trained weights,
    stay in the learner's parameter dtype, float32 by default). "auto": bfloat16 on a GPU that
    supports it (half the memory of float32: 15 instead of 30 GB for a 7B base), else
    policy.dtype (float32 on a CPU, where bfloat16 matmuls are slow). Checkpoints hold the
    trained weights only; a resumed learner rebuilds the base from policy.model."""


class PolicyValueSpec(SpecModel):
    """The policy's own estimate V(s) of a workflow state, read from its replies ``<value>0`` ...
    ``<value>9`` after the observation (``aflowrl.search.encoding``; no extra head, so vLLM and
    any Hugging Face checkpoint serve it). V is in return units: the sum of validation-score
    changes (scores in [0, 1]) an episode collects from the state on. Bin b stands for
    min + b (max - min) / 9; V is the probability-weighted mean of the bins."""

    enabled: bool = True
    """Read and train the value (fused selection with ``valueSource: policy`` needs it)."""
    min: float = Field(default=-0.25, ge=-10.0, le=10.0)
    """Centre of bin 0 (return units); lower returns are trained towards it."""
    max: float = Field(default=0.5, ge=-10.0, le=10.0)
    """Centre of bin 9 (return units); higher returns are trained towards it."""
    loss_coef: float = Field(default=0.5, ge=0.0, le=100.0)
    """Weight of the bins' cross-entropy (against the two-hot discounted return) in the
    learner's loss, beside the policy loss. GiGPO's advantages stay critic-free."""

    @model_validator(mode="after")
    def _range(self) -> PolicyValueSpec:
        if not self.min < self.max:
            raise ValueError(f"min={self.min} must be below max={self.max}")
        return self


class PolicySpec(SpecModel):
    """The model trained by RL."""

    model: str = Field(default=TINY_MODEL, min_length=1, max_length=1024)
    """Hugging Face model directory (e.g. a mounted "/models/Qwen2.5-7B-Instruct"), or a
    project-built model: "tiny" (0.4 M parameters, fast on a CPU), "small" (4 M) or "base"
    (90 M, for a GPU). Nothing is downloaded from a hub."""
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
    """Frozen reference model for the KL term; empty = the policy RL starts from: the warm
    start's weights when the run warm-starts (the learner copies them at its first RL update),
    else the initial weights."""
    value: PolicyValueSpec = Field(default_factory=PolicyValueSpec)
    """The policy's value estimate, used by fused parent selection."""
    persistent_volume_claim: DnsLabel | None = None
    """On Kubernetes: a PVC holding the model directories, mounted read-only at /models in the
    rollout, learner and trainer pods (``model: /models/Qwen2.5-7B-Instruct``); empty: the model
    is inside the image (or "tiny", built on first use)."""
