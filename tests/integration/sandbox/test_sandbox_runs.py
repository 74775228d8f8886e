"""What a sandboxed run sees and returns, in every isolation mode this machine has.

Statuses, output, stdin, exit codes, tracebacks, the script-like ``__main__``, each limit, a
fresh directory per run, concurrency and cancellation through ``arun``, the default pool.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid

import pytest

from aflowrl import sandbox
from aflowrl.sandbox import SandboxClosedError, SandboxLimits, SandboxPool
from aflowrl.sandbox import pool as pool_module


def test_output_stdin_and_metadata(pool):
    result = pool.run(
        "import sys\nname = sys.stdin.readline().strip()\nprint(f'hi {name}')\n"
        "print('to stderr', file=sys.stderr)",
        stdin="ada\n",
    )
    assert result.status == "ok" and result.ok
    assert (result.returncode, result.reason, result.truncated) == (0, None, False)
    assert result.stdout == "hi ada\n"
    assert result.stderr == "to stderr\n"
    assert result.duration_s > 0 and result.cpu_s >= 0 and result.max_rss_mb > 0
    assert result.mode == pool.mode and result.protections == pool.protections


def test_an_uncaught_exception_is_an_error_with_the_scripts_traceback(pool):
    result = pool.run("def f():\n    assert 1 == 2, 'boom'\n\nf()\n")
    assert (result.status, result.returncode) == ("error", 1)
    assert result.stderr.startswith("Traceback (most recent call last):\n")
    assert 'main.py", line 4, in <module>' in result.stderr
    assert result.stderr.endswith("AssertionError: boom\n")
    assert "_run_main" not in result.stderr  # the sandbox's own frames are hidden


def test_syntax_errors_are_reported_like_the_interpreter(pool):
    result = pool.run("def f(:\n    pass\n")
    assert (result.status, result.returncode) == ("error", 1)
    assert "SyntaxError" in result.stderr and "main.py" in result.stderr


@pytest.mark.parametrize(
    ("code", "status", "returncode", "stderr"),
    [
        ("import sys; sys.exit(0)", "ok", 0, ""),
        ("import sys; sys.exit(3)", "error", 3, ""),
        ("import sys; sys.exit('bye')", "error", 1, "bye\n"),
        ("import os; print('x', flush=True); os._exit(5)", "error", 5, ""),
        ("raise KeyboardInterrupt", "error", 1, "KeyboardInterrupt\n"),
    ],
)
def test_exit_statuses(pool, code, status, returncode, stderr):
    result = pool.run(code)
    assert (result.status, result.returncode) == (status, returncode)
    assert result.stderr.endswith(stderr)


def test_the_code_runs_as_a_script_in_an_empty_directory(pool):
    code = (
        "import json, os, sys\n"
        "open('helper.py', 'w').write('VALUE = 42\\n')\n"
        "import helper\n"
        "print(json.dumps({'name': __name__, 'argv0': sys.argv[0], 'file': __file__,\n"
        "    'cwd': os.getcwd(), 'home': os.environ['HOME'], 'value': helper.VALUE,\n"
        "    'listing': sorted(os.listdir('.')), 'env': sorted(os.environ)}))\n"
    )
    seen = json.loads(pool.run(code).stdout)
    assert seen["name"] == "__main__" and seen["value"] == 42
    assert seen["argv0"] == seen["file"] == f"{seen['cwd']}/main.py"
    assert seen["home"] == seen["cwd"]
    assert set(seen["listing"]) <= {"main.py", "helper.py", "__pycache__"}
    assert "PATH" in seen["env"] and not [v for v in seen["env"] if "SECRET" in v]
    again = json.loads(pool.run("import os, json; print(json.dumps(os.listdir('.')))").stdout)
    assert again == ["main.py"]  # nothing of the previous run is left


def test_wall_clock_timeout(pool):
    result = pool.run("import time\ntime.sleep(60)", limits=SandboxLimits(timeout_s=0.5))
    assert (result.status, result.reason) == ("timeout", "wall_time")
    assert result.returncode == -9


def test_cpu_time_limit_is_a_timeout(pool):
    result = pool.run("import os, signal\nos.kill(os.getpid(), signal.SIGXCPU)")
    assert (result.status, result.reason) == ("timeout", "cpu_time")


def test_a_crash_by_signal_is_killed(pool):
    result = pool.run("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)")
    assert (result.status, result.reason, result.returncode) == ("killed", "signal SIGSEGV", -11)


def test_output_over_the_cap_kills_the_run(pool):
    limits = SandboxLimits(max_output_bytes=1000)
    result = pool.run("print('x' * 5_000_000)", limits=limits)
    assert (result.status, result.reason, result.truncated) == ("killed", "output_limit", True)
    assert result.stdout == "x" * 1000
    small = pool.run("print('y' * 999, end='')", limits=limits)
    assert (small.status, small.truncated, small.stdout) == ("ok", False, "y" * 999)


def test_undecodable_output_is_replaced(pool):
    result = pool.run("import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe')")
    assert result.stdout == "ok \ufffd\ufffd"


def test_address_space_limit(pool):
    result = pool.run("x = bytearray(2 * 1024**3)", limits=SandboxLimits(memory_mb=256))
    assert result.status == "error"
    assert result.stderr.rstrip().endswith("MemoryError")


def test_file_size_limit(pool):
    result = pool.run(
        "open('big', 'wb').write(b'x' * (3 << 20))", limits=SandboxLimits(max_file_mb=1)
    )
    assert result.status == "error" and "File too large" in result.stderr


def test_open_files_limit(pool):
    code = "files = [open('main.py') for _ in range(100)]"
    result = pool.run(code, limits=SandboxLimits(max_open_files=32))
    assert result.status == "error" and "Too many open files" in result.stderr


def test_process_limit_counts_threads(pool):
    if "unprivileged_user" not in pool.protections:
        pytest.skip("RLIMIT_NPROC does not bind root")
    code = (
        "import threading, time\n"
        "for _ in range(20):\n"
        "    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
    )
    result = pool.run(code, limits=SandboxLimits(max_processes=8))
    assert result.status == "error" and "can't start new thread" in result.stderr


def test_threads_subprocesses_and_multiprocessing_work(pool):
    code = (
        "import multiprocessing, subprocess, sys, threading\n"
        "out = []\n"
        "threads = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in threads]; [t.join() for t in threads]\n"
        "child = subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True,\n"
        "    text=True, check=True)\n"
        "with multiprocessing.Pool(2) as workers:\n"
        "    squares = workers.map(abs, [-1, -2, -3])\n"
        "print(sorted(out), child.stdout.strip(), squares)\n"
    )
    result = pool.run(code, limits=SandboxLimits(timeout_s=20))
    assert result.status == "ok", result.stderr
    assert result.stdout == "[0, 1, 2, 3] 42 [1, 2, 3]\n"


def test_non_daemon_threads_finish_before_exit(pool):
    code = (
        "import threading, time\n"
        "def late():\n    time.sleep(0.2); print('thread done', flush=True)\n"
        "threading.Thread(target=late).start()\nprint('main done')\n"
    )
    result = pool.run(code)
    assert result.stdout == "main done\nthread done\n"


def test_packages_of_the_interpreter_are_importable(pool):
    """Code runs on the pool's interpreter with that interpreter's packages: this
    environment's (numpy, yaml) when it is ``sys.executable``; a system interpreter's own
    (the rlimits pool of a root caller whose environment other users cannot read, e.g. a
    checkout in a ``mktemp -d`` directory, runs one any user can)."""
    if pool._python == sys.executable:
        result = pool.run("import numpy, yaml\nprint(numpy.arange(3).sum())")
        assert (result.status, result.stdout) == ("ok", "3\n"), result.stderr
        return
    expected = subprocess.run(
        [pool._python, "-c", "import sys; print(sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = pool.run("import json, sqlite3, sys\nprint(sys.prefix)")
    assert (result.status, result.stdout) == ("ok", expected), result.stderr


async def test_concurrent_runs_are_bounded_by_the_pool(pool):
    code = (
        "import os, sys, time\nn = int(sys.stdin.read())\nstart = time.time()\n"
        "time.sleep(0.05)\nprint(n * n, start, time.time())\n"
    )
    results = await asyncio.gather(*(pool.arun(code, stdin=str(i)) for i in range(12)))
    assert [r.status for r in results] == ["ok"] * 12
    spans = []
    for i, result in enumerate(results):
        square, start, end = result.stdout.split()
        assert int(square) == i * i
        spans.append((float(start), float(end)))
    overlap = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert 1 <= overlap <= pool.size


async def test_cancelling_the_caller_kills_the_run(pool, strays):
    marker = f"cancel-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)  # {marker}'])\n"
        "time.sleep(60)\n"
    )
    task = asyncio.ensure_future(pool.arun(code, limits=SandboxLimits(timeout_s=60)))
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert strays(marker) == []
    assert (await pool.arun("print('next')")).stdout == "next\n"


def test_workers_are_replaced_after_their_quota():
    with SandboxPool(1, max_runs_per_worker=1) as fresh:
        results = [fresh.run(f"print({i})") for i in range(3)]
    assert [r.stdout for r in results] == ["0\n", "1\n", "2\n"]
    with pytest.raises(SandboxClosedError):
        fresh.run("print(1)")


async def test_pool_as_async_context_manager():
    async with SandboxPool(1) as fresh:
        assert (await fresh.arun("print(sum(range(10)))")).stdout == "45\n"
    assert fresh.closed


def test_a_pool_must_be_started():
    with pytest.raises(SandboxClosedError):
        SandboxPool(1).run("print(1)")


async def test_module_functions_use_the_default_pool():
    try:
        result = sandbox.run_python("print(input()[::-1])", stdin="abc\n", timeout_s=5)
        assert (result.status, result.stdout) == ("ok", "cba\n")
        again = await sandbox.arun_python("print(2 + 2)", memory_mb=256)
        assert again.stdout == "4\n"
        assert sandbox.default_pool() is sandbox.default_pool()
    finally:
        pool_module._close_default_pool()
    assert sandbox.default_pool() is not None  # a closed default pool is started afresh
    pool_module._close_default_pool()
