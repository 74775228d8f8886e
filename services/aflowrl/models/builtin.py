"""The project-built policy models: deterministic, randomly initialised Qwen2-architecture LMs.

They make the whole system (rollout, learner, weight sync, warm start, training loop) runnable and
testable with no download. Presets (:data:`PRESETS`) trade speed for capacity:

* ``tiny`` (the embedded default; 2 layers, hidden 64: about 0.4 M parameters): fast on 2 CPU
  cores, for tests and the demo;
* ``small`` (4 layers, hidden 256: about 4 M): reads an observation better, still trainable on a
  CPU in minutes;
* ``base`` (12 layers, hidden 768: about 90 M): for a GPU machine when no pretrained checkpoint
  may be used; a real Hugging Face checkpoint (Qwen2.5) goes through the same code.

``aflowrl model init --preset NAME --out DIR`` calls :func:`build`; ``policy.model: NAME``
resolves to :func:`ensure`, a copy cached under ``$AFLOWRL_CACHE_DIR/models``.

The tokenizer (shared by the presets) is a byte-level BPE of :data:`VOCAB_SIZE` tokens trained
here on the project's own texts: ``corpus.txt`` shipped with the package, plus what the policy
reads and writes, generated from the code at build time (the library workflows rendered as the
observation shows them, the operator descriptions of every task type, the prompt library, the
action language and the admissible actions of the library workflows, the reply encoding), so an
observation costs few tokens. It is trained with exactly the pipeline ``Qwen2Tokenizer`` rebuilds
on load (NFC, a split on Qwen2's pre-tokenisation regex, byte-level without its own regex), so
the ids of the trained tokenizer and of ``AutoTokenizer.from_pretrained(DIR)`` agree. The chat
template is ChatML (``<|im_start|>role\\n...<|im_end|>``) as in Qwen2.5-Instruct; ``<|im_end|>``
ends a turn. Attention heads have head_dim 32 or more (vLLM's CPU attention needs it).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

from aflowrl import envs

logger = logging.getLogger(__name__)

RECIPE_VERSION = 2
"""Bumped whenever the recipe changes, so a cached copy of an older recipe is not reused."""

VOCAB_SIZE = 4096
"""Most tokens the BPE may learn; the model's vocabulary is exactly what the corpus yields, so
every id the model can sample decodes."""
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML, as Qwen2.5-Instruct renders it (without the default system message)."""


@dataclass(frozen=True)
class Shape:
    """The architecture of a preset (Qwen2, tied embeddings)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_positions: int = 8192


PRESETS: Final[dict[str, Shape]] = {
    "tiny": Shape(hidden=64, layers=2, heads=2, kv_heads=1, intermediate=128),
    "small": Shape(hidden=256, layers=4, heads=8, kv_heads=2, intermediate=704),
    "base": Shape(hidden=768, layers=12, heads=12, kv_heads=4, intermediate=2048),
}
"""The built-in models by name (``policy.model``)."""

_OBSERVATION_TITLES = (
    "# Optimising an agentic workflow for",
    "## Workflow to modify:",
    "## Tried on this workflow",
    "## Problems it got wrong",
    "## Operators",
    "## Action language (one action)",
    "## Admissible actions (reply with one of them)",
    "## Reply",
    "[already in the tree as workflow",
    "choosing it gains nothing]",
    "[duplicate of workflow",
    "nothing gained]",
    "[improved] [no change] [worse] [rejected]",
    "left out to fit the observation]",
)


def corpus_lines() -> list[str]:
    """The tokenizer's training text: the shipped corpus plus the project's own texts."""
    from aflowrl.benchmarks.base import TaskType
    from aflowrl.search import encoding, prompt_library
    from aflowrl.search.actions import GRAMMAR
    from aflowrl.search.edits import admissible_actions
    from aflowrl.workflow import describe_operators, library, render_text

    shipped = resources.files("aflowrl.models").joinpath("corpus.txt").read_text("utf-8")
    lines = [line for line in shipped.splitlines() if line.strip()]
    lines.extend(_OBSERVATION_TITLES)
    lines.extend(GRAMMAR.splitlines())
    lines.append(encoding.SYSTEM_PROMPT)
    lines.extend(encoding.value_replies())
    tasks: tuple[TaskType, ...] = ("math", "code", "qa")
    for task in tasks:
        lines.extend(describe_operators(task).splitlines())
        for texts in prompt_library.PROMPTS[task].values():
            lines.extend(texts)
        for name in ("seed", *library.CLASSIC):
            graph = library.load(name, task)
            lines.extend(render_text(graph, prompt_chars=None).splitlines())
            lines.extend(
                encoding.action_reply(c.text) for c in admissible_actions(graph, limit=512)
            )
    lines.extend(f"{i} + {i + 7} = {2 * i + 7}; score {i / 10:.1f}%" for i in range(1000))
    return lines


def _train_tokenizer(lines: list[str]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Train the byte-level BPE with Qwen2Tokenizer's pipeline; return (vocab, merges)."""
    import json

    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tokenizer = Tokenizer(BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = [
        (m.split(" ", 1)[0], m.split(" ", 1)[1]) if isinstance(m, str) else (m[0], m[1])
        for m in model["merges"]
    ]
    return {str(k): int(v) for k, v in model["vocab"].items()}, merges


def build(out: str | Path, *, preset: str = "tiny", seed: int = 0) -> Path:
    """Write the preset's model, tokenizer and generation config to ``out`` (deterministic).

    The same ``preset``, ``seed`` and package version give byte-identical files.
    """
    if preset not in PRESETS:
        raise ValueError(f"no built-in model {preset!r} (one of {', '.join(PRESETS)})")
    shape = PRESETS[preset]
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab, merges = _train_tokenizer(corpus_lines())
    tokenizer_class: Any = Qwen2Tokenizer
    hf_tokenizer = tokenizer_class(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=8192,
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    hf_tokenizer.save_pretrained(out)

    im_end = vocab["<|im_end|>"]
    endoftext = vocab["<|endoftext|>"]
    config_class: Any = Qwen2Config
    config = config_class(
        vocab_size=len(hf_tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.hidden // shape.heads,
        max_position_embeddings=shape.max_positions,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=endoftext,
        dtype="float32",
    )
    with _seeded(torch, seed):
        model: Any = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=[im_end, endoftext],
        pad_token_id=endoftext,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
    ).save_pretrained(out)
    logger.info("%s model written to %s (%d tokens in the vocabulary)", preset, out, len(vocab))
    return out


@contextlib.contextmanager
def _seeded(torch: object, seed: int) -> Iterator[None]:
    import torch as _torch

    state = _torch.random.get_rng_state()
    _torch.manual_seed(seed)
    try:
        yield
    finally:
        _torch.random.set_rng_state(state)


def cached_path(preset: str) -> Path:
    """Where :func:`ensure` keeps a preset's model."""
    return Path(envs.AFLOWRL_CACHE_DIR) / "models" / f"{preset}-v{RECIPE_VERSION}"


def ensure(preset: str = "tiny") -> Path:
    """The cached preset model, built on first use (safe when several processes start at once)."""
    target = cached_path(preset)
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / f".{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (target / "config.json").is_file():  # another process built it meanwhile
            return target
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(staging, preset=preset)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("built the %s policy model in %s", preset, target)
    return target


def directory_digest(path: str | Path) -> str:
    """SHA-256 over the names and bytes of every file in ``path`` (to prove determinism)."""
    digest = hashlib.sha256()
    root = Path(path)
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(file.relative_to(root)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()
