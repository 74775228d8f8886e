"""Runs the whole system as local processes (the embedded default of ``aflowrl train``).

- :mod:`aflowrl.local.launcher`: starts the environment replicas, the rollout and the learner
  as children on free loopback ports (:func:`~aflowrl.local.launcher.local_services`);
- :mod:`aflowrl.local.processes`: child processes in their own process groups, health checks,
  clean stops (none left behind, even when the launcher is killed);
- :mod:`aflowrl.local.preflight`: checks of the run's inputs before anything starts;
- :mod:`aflowrl.local.run`: services plus the trainer (:func:`~aflowrl.local.run.run_local`).
"""

__all__ = ["errors", "launcher", "preflight", "processes", "run"]
