"""The built-in policy models: deterministic, reloadable by transformers, ChatML, no hub."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from aflowrl.cli import main
from aflowrl.models import builtin, loading
from aflowrl.models.errors import ModelNotFoundError


def test_build_is_deterministic_and_reloads(tmp_path):
    first = builtin.build(tmp_path / "a")
    assert main(["model", "init", "--out", str(tmp_path / "b")]) == 0
    assert builtin.directory_digest(first) == builtin.directory_digest(tmp_path / "b")

    tokenizer = loading.load_tokenizer(first)
    assert type(tokenizer).__name__ == "Qwen2Tokenizer"
    model = loading.load_causal_lm(
        first, dtype=loading.torch_dtype("float32"), device=loading.default_device()
    )
    config = model.config
    assert config.model_type == "qwen2" and config.tie_word_embeddings
    assert config.head_dim >= 32  # vLLM's CPU attention needs it
    assert config.vocab_size == len(tokenizer)  # every id the model samples decodes
    # The trained tokenizer and the one transformers rebuilds give the same ids.
    raw = Tokenizer.from_file(str(first / "tokenizer.json"))
    for line in builtin.corpus_lines():
        assert raw.encode(line).ids == tokenizer(line, add_special_tokens=False).input_ids, line


def test_chat_template_and_action_vocabulary():
    path = builtin.ensure("tiny")
    tokenizer = loading.load_tokenizer(path)
    text = tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "You optimise workflows."},
            {"role": "user", "content": "go"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == (
        "<|im_start|>system\nYou optimise workflows.<|im_end|>\n"
        "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.eos_token_id in loading.eos_token_ids(path, tokenizer)
    # The action language and operator names are short in tokens (learned merges).
    for phrase in ("<action>", "</action>", " ScEnsemble", " AnswerGenerate", " set_prompt"):
        assert len(tokenizer(phrase, add_special_tokens=False).input_ids) <= 3, phrase
    assert builtin.ensure("tiny") == path  # cached


def test_an_observation_costs_few_tokens():
    """The tokenizer is trained on what the policy reads: about 3 characters per token or more on
    an observation of a library workflow (the old 2k-token vocabulary gave 2.3)."""
    from aflowrl.search import encoding
    from aflowrl.search.edits import admissible_actions
    from aflowrl.workflow import describe_operators, library, render_text

    tokenizer = loading.load_tokenizer(builtin.ensure("tiny"))
    graph = library.load("medprompt", "code")
    text = "\n".join(
        [
            render_text(graph, prompt_chars=None),
            describe_operators("code"),
            *(f"- {c.text}" for c in admissible_actions(graph, 9)),
            encoding.SYSTEM_PROMPT,
        ]
    )
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert len(text) / len(ids) >= 3.0, len(text) / len(ids)


@pytest.mark.parametrize("preset", ["small", "base"])
def test_the_larger_presets_have_their_shapes(tmp_path, preset):
    path = builtin.build(tmp_path / preset, preset=preset)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    shape = builtin.PRESETS[preset]
    assert (config.hidden_size, config.num_hidden_layers) == (shape.hidden, shape.layers)
    assert config.head_dim >= 32
    with pytest.raises(ValueError, match="no built-in model"):
        builtin.build(tmp_path / "x", preset="huge")


def test_a_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"policy\.model.*never downloads"):
        loading.resolve_model_path("Qwen/Qwen2.5-7B-Instruct")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        loading.resolve_model_path(str(tmp_path / "empty"))
    assert main(["model", "path", str(tmp_path / "nothing")]) == 2
