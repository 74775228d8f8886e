"""A child for the process-management tests: serves gRPC health on a port until SIGTERM.

``python health_child.py PORT PIDFILE [--exit-at-once] [--ignore-term] [--leak]`` starts a
grandchild (a ``sleep`` in its process group, like a sandbox worker or a torchrun rank), writes
its pid to PIDFILE and serves. On SIGTERM it stops and ends its grandchild, as the services do,
unless ``--leak`` (then only a signal to the whole group reaches it). ``--exit-at-once`` fails
during start-up; ``--ignore-term`` ignores SIGTERM (only SIGKILL stops it).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys

from aflowrl.common.server import GrpcServer, ServerOptions


async def _main(port: int, *, ignore_term: bool, grandchild: subprocess.Popen[bytes], leak: bool):
    server = GrpcServer(ServerOptions(component="rollout", host="127.0.0.1", port=port), [])
    if not ignore_term:
        server.handle_signals()
    try:
        async with server:
            if ignore_term:
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                await asyncio.Event().wait()
            await server.serve_until_signal()
    finally:  # inside the loop, as the services clean up: the signal handlers still stand
        if not leak:
            grandchild.terminate()
            await asyncio.to_thread(grandchild.wait)


if __name__ == "__main__":
    port, pidfile = int(sys.argv[1]), sys.argv[2]
    if "--exit-at-once" in sys.argv:
        print("cannot start: the model directory is missing", flush=True)
        sys.exit(3)
    grandchild = subprocess.Popen(["sleep", "300"])
    with open(pidfile, "w") as out:
        out.write(f"{grandchild.pid}\n")
    asyncio.run(
        _main(
            port,
            ignore_term="--ignore-term" in sys.argv,
            grandchild=grandchild,
            leak="--leak" in sys.argv,
        )
    )
