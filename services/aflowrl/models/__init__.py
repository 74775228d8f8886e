"""The policy model shared by the rollout and learner services.

- :mod:`aflowrl.models.builtin`: the deterministic project-built Qwen2-architecture models
  (presets ``tiny``, ``small``, ``base``) and their locally trained tokenizer (``aflowrl model
  init --preset NAME``; ``policy.model: tiny``);
- :mod:`aflowrl.models.tokens`: how prompts and replies become token ids (rollout and proposer);
- :mod:`aflowrl.models.loading`: resolving a model name to a local directory and loading it;
- :mod:`aflowrl.models.logprobs`: the log-probability semantics both services share;
- :mod:`aflowrl.models.weights`: weight manifests, chunked payloads, their verification, and the
  safetensors directory format of the filesystem transport.

Both GPU services import this package; the environment side never does (it needs torch).
"""

__all__ = ["builtin", "errors", "loading", "logprobs", "tokens", "weights"]
