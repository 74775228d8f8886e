"""LoRA adapters merged into their base weights give the same model as peft's forward pass."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from aflowrl.learner.export import hf_tensors
from aflowrl.learner.policy import PolicyModule
from aflowrl.models import builtin, loading
from aflowrl.models.weights import parameter_shapes


def test_merged_lora_equals_the_adapted_model():
    path = builtin.ensure("tiny")
    cpu = torch.device("cpu")
    base = loading.load_causal_lm(path, dtype=torch.float32, device=cpu)
    shapes = parameter_shapes(base)
    adapted = get_peft_model(
        loading.load_causal_lm(path, dtype=torch.float32, device=cpu),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    module = PolicyModule(adapted, critic=True)
    exported = hf_tensors(module.state_dict(), shapes, lora_scale=8 / 4)
    assert list(exported) == list(shapes)  # HF names, no value head, no adapters
    params = dict(base.named_parameters())
    with torch.no_grad():
        for name, tensor in exported.items():
            params[name].copy_(tensor)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        expected = adapted(input_ids=ids).logits
        merged = base(input_ids=ids).logits
    assert torch.allclose(expected, merged, atol=1e-5)
    assert not torch.allclose(
        expected,
        loading.load_causal_lm(path, dtype=torch.float32, device=cpu)(input_ids=ids).logits,
    )
