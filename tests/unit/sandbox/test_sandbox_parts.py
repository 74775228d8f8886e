"""The sandbox's pure parts: limits, input checks, plans, the wire format, the zygote's cleanup."""

from __future__ import annotations

import json
import os
import sys
import venv

import pytest

from aflowrl.sandbox import SandboxLimitError, SandboxLimits, SandboxPool, _launch, _zygote
from aflowrl.sandbox.pool import _encode


def test_default_limits_are_valid_and_cpu_rounds_up():
    limits = SandboxLimits()
    assert limits.timeout_s == 10.0 and limits.memory_mb == 1024
    assert SandboxLimits(timeout_s=0.2).cpu_s == 1
    assert SandboxLimits(timeout_s=2.5).cpu_s == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", 0),
        ("timeout_s", float("nan")),
        ("timeout_s", 1e9),
        ("memory_mb", 8),
        ("memory_mb", 512.5),
        ("max_output_bytes", 0),
        ("max_processes", 0),
        ("max_open_files", 3),
        ("max_file_mb", True),
    ],
)
def test_bad_limits_name_their_field(field, value):
    with pytest.raises(SandboxLimitError) as info:
        SandboxLimits(**{field: value})
    assert info.value.field == field


def test_code_and_stdin_are_checked():
    assert _encode("print(1)", None) == (b"print(1)", b"")
    assert _encode("x", "é") == (b"x", "é".encode())
    assert _encode("x", b"\xff") == (b"x", b"\xff")
    with pytest.raises(SandboxLimitError) as info:
        _encode(b"print(1)", None)  # type: ignore[arg-type]
    assert info.value.field == "code"
    with pytest.raises(SandboxLimitError) as info:
        _encode("\ud800", None)
    assert info.value.field == "code"
    with pytest.raises(SandboxLimitError) as info:
        _encode("x", 3)  # type: ignore[arg-type]
    assert info.value.field == "stdin"


def test_pool_arguments_are_checked():
    with pytest.raises(SandboxLimitError) as info:
        SandboxPool(0)
    assert info.value.field == "size"
    with pytest.raises(SandboxLimitError) as info:
        SandboxPool(1, mode="docker")
    assert info.value.field == "mode"


def test_mode_setting_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("AFLOWRL_SANDBOX", "RLIMITS")
    assert SandboxPool(1)._setting == "rlimits"
    monkeypatch.setenv("AFLOWRL_SANDBOX", "chroot")
    with pytest.raises(SandboxLimitError) as info:
        SandboxPool(1)
    assert info.value.field == "AFLOWRL_SANDBOX"
    plans = _launch.candidate_plans("rlimits", sys.executable, 64)
    assert plans and all(plan.mode == "rlimits" for plan in plans)


def test_plans_are_ordered_best_first():
    plans = _launch.candidate_plans("auto", sys.executable, 64)
    kinds = [plan.kind for plan in plans]
    assert kinds[-1] == "rlimits-caller"
    if os.geteuid() == 0:
        assert kinds[-2] == "rlimits-uid"
    if _launch.shutil.which("bwrap"):
        assert kinds[0] in ("bwrap-root", "bwrap-userns")


def test_protections_depend_on_the_plan_and_the_filter():
    bwrap = _launch.Plan("bwrap-root", sys.executable, 1 << 20, bwrap="/usr/bin/bwrap")
    names = bwrap.protections(seccomp=True)
    assert {"pid_namespace", "no_network", "dedicated_user", "seccomp", "no_userns"} <= set(names)
    fallback = _launch.Plan("rlimits-caller", sys.executable, 1 << 20)
    assert "no_network" not in fallback.protections(seccomp=False)
    assert "kill_leftovers" not in fallback.protections(seccomp=False)  # the zygote is exposed
    assert {"no_network", "kill_leftovers"} <= set(fallback.protections(seccomp=True))
    assert len(set(names)) == len(names)
    assert set(names) <= set(_launch.ALL_PROTECTIONS)


def test_bwrap_command_binds_only_system_and_interpreter():
    plan = _launch.Plan(
        "bwrap-userns", sys.executable, 1 << 20, bwrap="/usr/bin/bwrap", env={"A": "1"}
    )
    argv, kwargs = plan.command(None, None)
    assert kwargs == {"env": {}}
    assert argv[0] == "/usr/bin/bwrap"
    binds = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind"}
    assert os.path.realpath(sys.prefix) in binds or sys.prefix in binds
    assert "/" not in binds and "/root" not in binds and "/home" not in binds
    assert not any(path.startswith("/usr/") for path in binds)  # /usr covers them
    for flag in ("--unshare-all", "--disable-userns", "--die-with-parent", "--as-pid-1"):
        assert flag in argv
    assert argv[argv.index("--setenv") + 1 : argv.index("--setenv") + 3] == ["A", "1"]
    assert argv[argv.index("HOME") - 1 : argv.index("HOME") + 2] == ["--setenv", "HOME", "/tmp/run"]


def test_binds_under_the_private_tmp_are_mounted_on_it_and_kept_by_the_wipe():
    plan = _launch.Plan("bwrap-root", "/tmp/t x/.venv/bin/python", 1 << 20, bwrap="/usr/bin/bwrap")
    binds = ["/usr", "/tmp/t x/.venv", "/opt/py", "/dev/shm/py"]
    plan.__dict__["filesystem"] = _launch.Filesystem(binds, [], ["/tmp/t x/.venv", "/opt/py"])
    argv, _ = plan.command(7, None)
    tmpfs = argv.index("/tmp", argv.index("--tmpfs"))
    assert argv.index("/tmp/t x/.venv") > tmpfs  # bound onto the private /tmp, not hidden by it
    assert argv.index("/dev/shm/py") > argv.index("/dev/shm")
    made = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dir"]
    assert made == ["/opt", "/tmp/t x"]  # bubblewrap's own mounts are not made again
    config = json.loads(argv[-1])
    assert config["keep"] == ["/tmp/t x/.venv", "/dev/shm/py"]
    assert config["readable"] == ["/tmp/t x/.venv", "/opt/py"]


def test_the_wipe_keeps_the_binds_and_notices_them_moved(tmp_path):
    base = tmp_path / "tmp"
    kept = base / "t x" / ".venv"
    (kept / "lib").mkdir(parents=True)
    (base / "run").mkdir()
    (base / "junk").write_text("x")
    (base / "t x" / "planted").write_text("x")  # next to the bind, in its parent
    zygote = _zygote._Zygote({"base_dir": str(base), "keep": [str(kept)]})
    zygote.remember_kept()
    assert zygote._wipe()
    assert sorted(p.name for p in base.iterdir()) == ["t x"]
    assert [p.name for p in (base / "t x").iterdir()] == [".venv"]
    assert (kept / "lib").is_dir()
    os.rename(kept, base / "t x" / "moved")
    assert not zygote._wipe()  # the worker is replaced


def test_another_virtual_environment_is_bound_by_its_own_prefix(tmp_path):
    home = tmp_path / "other venv"
    venv.create(home, with_pip=False, symlinks=True)  # the same base binary as this one
    dirs = _launch._interpreter_dirs(str(home / "bin" / "python"))
    assert str(home) in dirs
    assert sys.prefix == sys.base_prefix or sys.prefix not in dirs


def test_nested_paths_collapse_to_their_outermost_bind():
    paths = ["/usr/lib", "/usr", "/opt/py/lib", "/opt/py", "/opt/python"]
    assert _launch._outermost(paths) == ["/usr", "/opt/py", "/opt/python"]
    assert _launch._ancestors("/a/b/c") == ["/a/b", "/a"]


def test_frames_round_trip_and_reject_garbage():
    frame = _zygote.encode_frame({"status": "ok"}, b"out", b"")
    length = _zygote.header_length(frame[:4])
    header, sizes = _zygote.decode_header(frame[4 : 4 + length])
    assert header == {"status": "ok"} and sizes == [3, 0]
    assert frame[4 + length :] == b"out"
    with pytest.raises(ValueError, match="exceeds"):
        _zygote.header_length((1 << 30).to_bytes(4, "big"))
    with pytest.raises(ValueError, match="JSON object"):
        _zygote.decode_header(b"[1, 2]")
    with pytest.raises(ValueError, match="payload sizes"):
        _zygote.decode_header(b'{"sizes": [-1]}')


def test_cleanup_removes_locked_and_very_deep_trees(tmp_path):
    root = tmp_path / "run"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f").write_text("x")
    (root / "link").symlink_to(tmp_path / "keep")
    (tmp_path / "keep").write_text("outside")
    os.chmod(root / "a" / "b", 0)
    os.chmod(root / "a", 0)
    deep = root / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    try:
        for _ in range(1500):  # deeper than PATH_MAX allows as one path, and than recursion
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    cwd = os.getcwd()
    assert _zygote._remove(str(root))
    assert os.getcwd() == cwd
    assert not root.exists()
    assert (tmp_path / "keep").read_text() == "outside"  # links are removed, not followed


def test_a_memory_error_is_recognised_from_the_traceback():
    assert _zygote._ends_in_memory_error(b"Traceback ...\n    x = y\nMemoryError\n")
    assert _zygote._ends_in_memory_error(b"MemoryError: out of arena\n")
    assert not _zygote._ends_in_memory_error(b"ValueError: MemoryError\n")
    assert not _zygote._ends_in_memory_error(b"")


def test_cleanup_gives_up_past_its_deadline(tmp_path):
    (tmp_path / "run" / "sub").mkdir(parents=True)
    assert not _zygote._remove(str(tmp_path / "run"), deadline=0.0)
    assert _zygote._remove(str(tmp_path / "run"))


def test_exit_codes_follow_the_interpreter():
    assert _zygote._exit_code(SystemExit()) == 0
    assert _zygote._exit_code(SystemExit(3)) == 3
    assert _zygote._exit_code(SystemExit(256 + 7)) == 7
    assert _zygote._exit_code(SystemExit("bye")) == 1
