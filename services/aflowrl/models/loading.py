"""Resolving ``policy.model`` to a local directory and loading its model and tokenizer.

Used by the rollout and learner services. Nothing is fetched from a hub: a name that is not a
local Hugging Face model directory (or a built-in preset: ``tiny``, ``small``, ``base``) is a clear
:class:`ModelNotFoundError`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aflowrl.config.policy import BUILT_IN_MODELS, TINY_MODEL, LoraSpec
from aflowrl.models import builtin
from aflowrl.models.errors import ModelNotFoundError

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")
"""dtype names accepted in specs and weight manifests."""


def resolve_model_path(name: str, *, field: str = "policy.model") -> Path:
    """The local directory of ``name``: a built-in preset's cached copy, else a directory."""
    if name in BUILT_IN_MODELS:
        return builtin.ensure(name)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        what = "directory has no config.json" if path.is_dir() else "no such directory"
        raise ModelNotFoundError(
            f"{field}: {name!r} is not a Hugging Face model directory ({what}); aflow-rl never "
            f"downloads models: mount the weights, or use a built-in model "
            f"({', '.join(BUILT_IN_MODELS)}; {TINY_MODEL!r} is the fastest)"
        )
    return path


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16`` (only the float types weights may have)."""
    import torch

    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r} (one of {', '.join(DTYPES)})")
    dtype: torch.dtype = getattr(torch, name)
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(spec_dtype: str, device: torch.device) -> torch.dtype:
    """``policy.dtype``: "auto" is bfloat16 on CUDA and float32 elsewhere."""
    if spec_dtype == "auto":
        return torch_dtype("bfloat16" if device.type == "cuda" else "float32")
    return torch_dtype(spec_dtype)


def default_device() -> torch.device:
    """CUDA device of this process (LOCAL_RANK) when there is one, else the CPU."""
    import torch

    from aflowrl import envs

    if torch.cuda.is_available():
        return torch.device("cuda", envs.LOCAL_RANK % torch.cuda.device_count())
    return torch.device("cpu")


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def load_tokenizer(path: Path, *, trust_remote_code: bool = False) -> Any:
    """The model's tokenizer (fast), with a pad token (the EOS token when it has none)."""
    from transformers import AutoTokenizer

    _quiet_transformers()
    tokenizer = AutoTokenizer.from_pretrained(
        path, local_files_only=True, trust_remote_code=trust_remote_code
    )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    path: Path, *, dtype: torch.dtype, device: torch.device, trust_remote_code: bool = False
) -> Any:
    """``AutoModelForCausalLM`` from ``path`` in ``dtype`` on ``device``, eval mode, SDPA."""
    from transformers import AutoModelForCausalLM

    _quiet_transformers()
    model: Any = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=dtype,
        local_files_only=True,
        trust_remote_code=trust_remote_code,
        attn_implementation="sdpa",
    )
    return model.to(device).eval()


def empty_causal_lm(path: Path, *, dtype: torch.dtype, trust_remote_code: bool = False) -> Any:
    """The module :func:`load_causal_lm` would return, on the meta device: shapes, no weights.

    Learner ranks other than 0 build this and receive their shards from rank 0 after sharding,
    so one host copy of the weights is read per learner, not one per rank. Buffers computed at
    construction (rotary frequencies) are meta too: the caller fills them.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    _quiet_transformers()
    config = AutoConfig.from_pretrained(
        path, local_files_only=True, trust_remote_code=trust_remote_code
    )
    with torch.device("meta"):
        model: Any = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
            config, dtype=dtype, trust_remote_code=trust_remote_code, attn_implementation="sdpa"
        )
    return model.eval()


def eos_token_ids(path: Path, tokenizer: Any) -> frozenset[int]:
    """Every id that ends a completion: the generation config's EOS ids and the tokenizer's."""
    from transformers import GenerationConfig

    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    try:
        config = GenerationConfig.from_pretrained(path, local_files_only=True)
    except OSError:
        config = None
    if config is not None and config.eos_token_id is not None:
        eos = config.eos_token_id
        ids.update(int(i) for i in (eos if isinstance(eos, list) else [eos]))
    return frozenset(ids)


def lora_config(lora: LoraSpec) -> Any:
    """peft's ``LoraConfig`` of ``policy.lora`` (the learner trains it, the hf rollout runs it)."""
    from peft import LoraConfig

    return LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,  # type: ignore[arg-type]  # a float scales as well
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def adapter_config(lora: LoraSpec, base_model: Path) -> dict[str, Any]:
    """PEFT's ``adapter_config.json`` of ``policy.lora`` (vLLM's LoRA loader reads it)."""
    out: dict[str, Any] = {}
    for key, value in lora_config(lora).to_dict().items():
        if isinstance(value, set | frozenset):
            out[key] = sorted(value)
        elif hasattr(value, "value"):  # enums (peft_type, task_type)
            out[key] = value.value
        else:
            out[key] = value
    out["base_model_name_or_path"] = str(base_model)
    return out


def adapter_file_name(parameter: str) -> str:
    """A peft parameter's name in adapter files (``lora_A.default.weight`` -> ``lora_A.weight``)."""
    for kind in (".lora_A.", ".lora_B."):
        if kind in parameter:
            head, tail = parameter.split(kind, 1)
            return f"{head}{kind}{tail.split('.', 1)[1]}"
    return parameter


def adapter_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """Names (as adapter files store them) and shapes of a peft model's LoRA weights."""
    return {
        adapter_file_name(name): tuple(p.shape)
        for name, p in model.named_parameters()
        if ".lora_A." in name or ".lora_B." in name
    }
