"""Exec a command that dies with its parent: ``python -m aflowrl.local._orphan_guard PID CMD...``.

The local launcher starts every service through this guard. It asks Linux to send SIGTERM to the
process when its parent dies (``prctl(PR_SET_PDEATHSIG)``, kept across ``execve``), checks the
parent is still ``PID`` (it may have died before the request), then replaces itself with
``CMD``. So even a launcher killed with SIGKILL, which cannot clean up, leaves no service behind.
The command starts with no signal blocked and SIGTERM and SIGINT at their defaults: a blocked or
ignored SIGTERM inherited from the launcher's caller would swallow that very signal.
Elsewhere than Linux the command simply runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> None:
    parent, command = int(argv[0]), argv[1:]
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            print(f"orphan guard: prctl failed (errno {ctypes.get_errno()})", file=sys.stderr)
        if os.getppid() != parent:  # the launcher died before the request took effect
            sys.exit(1)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, signal.SIG_DFL)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
