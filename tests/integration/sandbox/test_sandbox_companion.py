"""A ``private_main`` run's companion: a second process of the run, clean, limited, and gone after.

The main process sends the companion a program over fd 4 and reads its reply on fd 3. The
companion must hold nothing but its pipes (and /dev/null), run in the run's directory under the
run's limits, be dumpable where the main process is not, count towards the run's memory, and
leave nothing behind; a run without ``private_main`` has no companion.
"""

from __future__ import annotations

import json
import textwrap

from aflowrl.sandbox import SandboxLimits

PROBE = textwrap.dedent(
    """
    import ctypes, json, os, resource, sys
    libc = ctypes.CDLL(None)
    info = {
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd")),
        "stdio": [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)],
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "dumpable": libc.prctl(3, 0, 0, 0, 0),
        "memory": resource.getrlimit(resource.RLIMIT_AS)[0],
        "modules": [m for m in ("json", "re", "typing") if m in sys.modules],
    }
    os.write(4, json.dumps(info).encode())
    """
)

MAIN = textwrap.dedent(
    """
    import ctypes, json, os, struct
    program = {probe!r}.encode()
    os.write(4, struct.pack(">I", len(program)) + program)
    reply = b""
    while chunk := os.read(3, 65536):
        reply += chunk
    print(json.dumps({{
        "companion": json.loads(reply),
        "cwd": os.getcwd(),
        "dumpable": ctypes.CDLL(None).prctl(3, 0, 0, 0, 0),
    }}))
    """
)


def test_the_companion_is_a_clean_limited_process_of_the_run(pool):
    limits = SandboxLimits(timeout_s=20, memory_mb=512)
    result = pool.run(MAIN.format(probe=PROBE), limits=limits, private_main=True)
    assert result.ok, result.stderr
    seen = json.loads(result.stdout)
    companion = seen["companion"]
    assert companion["fds"] == [0, 1, 2, 3, 4, 5]  # 5: the directory being listed
    assert companion["stdio"] == ["/dev/null"] * 3
    assert companion["cwd"] == seen["cwd"]
    assert companion["argv"] == ["<companion>"]
    assert companion["memory"] == 512 << 20
    assert companion["modules"] == ["json", "re", "typing"]  # the template's, preloaded
    assert companion["dumpable"] == 1 and seen["dumpable"] == 0


def test_a_run_without_private_main_has_no_companion(pool):
    result = pool.run("import os\nprint(sorted(int(fd) for fd in os.listdir('/proc/self/fd')))")
    assert result.ok and result.stdout.strip() == "[0, 1, 2, 3]", result  # 3: the listing


def test_the_companion_counts_towards_the_runs_memory(pool):
    hog = "import os, time\nblock = bytearray(200 << 20)\nos.write(4, b'x')\ntime.sleep(30)\n"
    main = textwrap.dedent(
        f"""
        import os, struct, time
        program = {hog!r}.encode()
        os.write(4, struct.pack(">I", len(program)) + program)
        os.read(3, 1)
        block = bytearray(200 << 20)
        time.sleep(30)
        """
    )
    result = pool.run(main, limits=SandboxLimits(timeout_s=20, memory_mb=300), private_main=True)
    assert result.status == "killed" and result.reason == "memory", result


def test_the_companion_and_its_children_end_with_the_run(pool, strays):
    marker = "companion-leftover-4b1f"
    child = f"import os, subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}])\nos.write(4, b'x')\nimport time; time.sleep(600)\n"  # noqa: E501
    main = textwrap.dedent(
        f"""
        import os, struct
        program = {child!r}.encode()
        os.write(4, struct.pack(">I", len(program)) + program)
        os.read(3, 1)
        """
    )
    result = pool.run(main, limits=SandboxLimits(timeout_s=20), private_main=True)
    assert result.ok, result.stderr
    assert strays(marker) == []
    again = pool.run(MAIN.format(probe=PROBE), private_main=True)  # the template still serves
    assert again.ok, again.stderr
