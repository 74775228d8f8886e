"""The learner's command thread: commands in order, a heartbeat only while idle.

The other learner ranks wait for rank 0's next command on the control group, whose timeout is
real (the learner's collective timeout): an idle rank 0 sends a heartbeat, so only a rank 0
that is wedged lets that timeout end the learner.
"""

from __future__ import annotations

import asyncio
import threading

from aflowrl.learner.service import CommandThread


async def test_an_idle_command_thread_sends_heartbeats_and_a_busy_one_does_not():
    beats: list[str] = []
    beat = threading.Event()
    release = threading.Event()

    def heartbeat() -> None:
        beats.append("beat")
        beat.set()

    commands = CommandThread(heartbeat, idle_s=0.05)
    try:
        await asyncio.to_thread(beat.wait, 60)
        assert beats, "an idle command thread sent no heartbeat"

        started = threading.Event()

        def busy() -> str:
            beats.append("busy start")
            started.set()
            release.wait(60)
            beats.append("busy end")
            return "done"

        running = asyncio.ensure_future(commands.run(busy))
        await asyncio.to_thread(started.wait, 60)
        await asyncio.sleep(0.3)  # several idle periods while the command runs
        release.set()
        assert await running == "done"
        during = beats[beats.index("busy start") + 1 : beats.index("busy end")]
        assert during == [], "a heartbeat went out while a command was running"
        assert await commands.run(lambda: 7) == 7
    finally:
        release.set()
        commands.close(10)


async def test_a_command_thread_without_a_heartbeat_only_runs_commands():
    commands = CommandThread()
    try:
        assert [await commands.run(lambda i=i: i) for i in range(3)] == [0, 1, 2]
    finally:
        commands.close(10)
