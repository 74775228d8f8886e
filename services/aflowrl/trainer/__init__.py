"""The RL loop driving the environment, rollout and learner services (torch-free).

- :mod:`.loop`: the :class:`~aflowrl.trainer.loop.Trainer` (collect, advantages, log-probs,
  train, push weights, record, checkpoint, resume, final evaluation);
- :mod:`.collect`: resetting the episode groups, acting and stepping until they are done;
- :mod:`.tasks`: which task (benchmark by weight, task seed) each group plays; held-out seeds;
- :mod:`.evaluate`: a policy played on chosen tasks without training (held-out tasks, transfer);
- :mod:`.acting`: the policy's decisions (choice mode: scored admissible actions; text mode);
- :mod:`.routing`: environment replicas on a consistent-hash ring, with failover;
- :mod:`.noise`: the executor-sample noise of the step rewards (``noise/*``);
- :mod:`.advantages`: GiGPO / GRPO / PPO targets of step rows with :mod:`aflowrl.rl`;
- :mod:`.values`: V(s) sent to the environment for ``fused`` parent selection;
- :mod:`.learner_client`, :mod:`.weight_sync`: the learner's calls and the weight push;
- :mod:`.state`, :mod:`.records`, :mod:`.plots`, :mod:`.progress`, :mod:`.final`: checkpoints
  and resume, the run directory, the curves, the progress bar and the final comparison;
- :mod:`.app`: wiring the trainer to running services (``aflowrl train``).
"""

__all__ = [
    "acting",
    "advantages",
    "app",
    "clock",
    "collect",
    "errors",
    "evaluate",
    "final",
    "learner_client",
    "loop",
    "metrics",
    "noise",
    "plots",
    "progress",
    "records",
    "routing",
    "rows",
    "state",
    "tasks",
    "values",
    "weight_sync",
]
