"""Isolated execution of generated Python: bubblewrap namespaces, rlimits, a pre-started pool.

Called by the code benchmarks' scorers, the Programmer and Test operators and the environment
service::

    from aflowrl import sandbox

    result = sandbox.run_python(code, timeout_s=5, memory_mb=512, stdin="3 4\\n")
    result = await sandbox.arun_python(code, timeout_s=5)      # served by a pre-started pool
    if result.status == "ok": ...                               # ok | error | timeout | killed

Each run is a fresh child of a zygote that lives inside the sandbox, with its own session,
limits (wall clock, CPU time, address space, file size, processes, open files), empty working
directory, scrubbed environment and capped output; whatever it leaves behind is killed and
deleted. The isolation mode comes from $AFLOWRL_SANDBOX: ``auto`` (default; bubblewrap where it
can make namespaces, else rlimits; bubblewrap that runs but in which the worker fails is an
error, not a fallback), ``bwrap`` or ``rlimits``. ``private_main=True`` keeps a run's main
process non-dumpable and gives it a *companion*: a second, clean process of the run that runs
the program the main process sends it over a pipe, and cannot reach the main process's memory
(the code benchmarks' verdicts: the tests in the main process, the answer in the companion).
``SandboxResult.protections`` and a log line at pool start name the protections in force:

- ``rlimits``, ``wall_clock_kill``, ``scrubbed_env``, ``temp_dir``, ``output_cap``,
  ``memory_watchdog`` (summed memory and process count of a run), ``no_new_privs``: always;
- ``pid_namespace``, ``no_network``, ``private_filesystem`` (only the system and the
  interpreter, read-only, plus a private /tmp), ``ipc_namespace``: with bubblewrap;
- ``seccomp`` (where libseccomp is installed), which also brings ``no_network`` and
  ``no_userns`` without bubblewrap;
- ``kill_leftovers`` (nothing a run starts outlives it): with a PID namespace, a uid of its own,
  or the seccomp filter that keeps the code from killing its supervisor;
- ``unprivileged_user`` (the code is not root), ``dedicated_user`` (a host uid of its own, never
  the caller's), ``user_namespace``, ``caller_not_dumpable``: as the situation allows.
"""

from aflowrl.sandbox.errors import SandboxClosedError, SandboxLimitError, SandboxUnavailableError
from aflowrl.sandbox.pool import LimitArgs, SandboxPool, arun_python, default_pool, run_python
from aflowrl.sandbox.result import Mode, SandboxLimits, SandboxResult, Status

__all__ = [
    "LimitArgs",
    "Mode",
    "SandboxClosedError",
    "SandboxLimitError",
    "SandboxLimits",
    "SandboxPool",
    "SandboxResult",
    "SandboxUnavailableError",
    "Status",
    "arun_python",
    "default_pool",
    "run_python",
]
