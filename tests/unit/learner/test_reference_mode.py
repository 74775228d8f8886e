"""The LoRA reference pass (adapters off) leaves the adapters trainable as FSDP sees them."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from aflowrl.learner.policy import Policy, PolicyModule
from aflowrl.models import builtin, loading
from aflowrl.models.weights import parameter_shapes


def test_reference_mode_keeps_the_adapters_requires_grad():
    """peft's disable_adapter() turns the adapters' requires_grad off. FSDP2 reads
    requires_grad at its first forward to choose each group's gradient dtypes; when that first
    forward was the KL reference pass, a 7B LoRA run on GPU failed its first backward (bf16
    gradients assigned to float32 adapters; seen on an H100). Inside reference_mode the flags
    stay on, and the reference pass still runs the base model."""
    path = builtin.ensure("tiny")
    lm = loading.load_causal_lm(path, dtype=torch.float32, device=torch.device("cpu"))
    shapes = parameter_shapes(lm)
    adapted = get_peft_model(lm, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:
                param.fill_(0.5)
    policy = Policy(
        module=PolicyModule(adapted, critic=False),
        reference=None,
        has_reference=True,
        hf_shapes=shapes,
        model_dir=path,
        lora_scale=2.0,
        pad_id=0,
    )
    adapters = policy.trainable_parameters()
    assert adapters and all("lora_" in n for n, p in adapted.named_parameters() if p.requires_grad)
    ids = torch.tensor([[5, 6, 7, 8]])
    base = loading.load_causal_lm(path, dtype=torch.float32, device=torch.device("cpu"))
    with torch.no_grad():
        expected = base(input_ids=ids).logits
        with policy.reference_mode() as module:
            assert all(p.requires_grad for p in adapters)
            reference = module.lm(input_ids=ids).logits
        adapted_logits = policy.module.lm(input_ids=ids).logits
    assert torch.allclose(reference, expected, atol=1e-5)  # adapters really off
    assert not torch.allclose(adapted_logits, expected, atol=1e-3)  # and on again after
    assert all(p.requires_grad for p in adapters)
