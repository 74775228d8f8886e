"""Random-weight models with Qwen2.5's shapes, for the GPU benches (nothing is downloaded).

:func:`build_random_qwen` writes a Hugging Face model directory: the architecture and sizes of
a Qwen2.5 checkpoint (``QWEN25``) or any given sizes, random weights (normal, std 0.02; norms 1),
and the built-in tiny model's tokenizer and chat template. The model is constructed on the meta
device and filled in place in the target dtype, so a 7B directory takes seconds and one copy of
the weights in host memory, not the float32 initialisation transformers would run.
"""

from __future__ import annotations

import shutil
from pathlib import Path

QWEN25: dict[str, dict[str, int | bool]] = {
    # hidden, layers, heads, kv heads, intermediate, vocabulary, tied embeddings (config.json
    # of Qwen/Qwen2.5-*-Instruct)
    "0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936,
                 tied=True),
    "1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936,
                 tied=True),
    "7b": dict(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064,
               tied=False),
    # A CPU smoke size (the script's own checks, not a Qwen2.5 model).
    "smoke": dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128, vocab=4096,
                  tied=True),
}  # fmt: skip


def build_random_qwen(
    out: Path,
    *,
    hidden: int,
    layers: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    tied: bool,
    dtype: str = "bfloat16",
    seed: int = 0,
) -> int:
    """Write the model directory ``out``; returns its parameter count."""
    import torch
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    from aflowrl.models import builtin

    out.mkdir(parents=True, exist_ok=True)
    tiny_dir = builtin.ensure("tiny")
    for file in tiny_dir.iterdir():
        if "token" in file.name or file.name in {"generation_config.json", "chat_template.jinja"}:
            shutil.copy(file, out / file.name)
    fields = AutoConfig.from_pretrained(tiny_dir).to_dict()
    for derived in ("layer_types", "architectures", "transformers_version", "model_type"):
        fields.pop(derived, None)
    fields.update(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        vocab_size=max(vocab, builtin.VOCAB_SIZE),
        tie_word_embeddings=tied,
        torch_dtype=dtype,
    )
    config = Qwen2Config(**fields)
    torch_dtype = getattr(torch, dtype)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # parameters are created in the target dtype
    try:
        with torch.device("meta"):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    # Buffers (rotary frequencies) are not saved: from_pretrained computes them again.
    model = model.to_empty(device="cpu")
    # Drawn on the GPU when there is one (a 7B model's 7.6e9 normals take minutes on a CPU).
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                drawn = torch.empty(param.shape, dtype=param.dtype, device=device)
                param.copy_(drawn.normal_(0.0, 0.02, generator=generator))
    if tied:
        model.tie_weights()
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())
