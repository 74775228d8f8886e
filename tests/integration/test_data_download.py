"""``aflowrl data download`` against a real HTTP server on loopback serving an archive built here.

The archive holds small split files in a sub-folder (as AFlow's does) plus a file nobody asked
for; the manifest with their checksums is written beside it and passed with ``--manifest``, so
nothing is fetched from outside 127.0.0.1 and no real data is committed.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import socket
import tarfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from aflowrl.benchmarks import get_benchmark
from aflowrl.cli import main
from aflowrl.cli.exitcodes import ExitCode

FILES = {
    "gsm8k_validate.jsonl": b'{"id": "v0", "question": "What is 1 + 1?", "answer": "2"}\n',
    "gsm8k_test.jsonl": b'{"id": "t0", "question": "What is 2 + 2?", "answer": "4"}\n',
    "math_validate.jsonl": b'{"problem": "1+2?", "solution": "\\\\boxed{3}"}\n',
}


def _archive() -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in [*FILES.items(), ("README.txt", b"not a split\n")]:
            info = tarfile.TarInfo(f"datasets/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@dataclass
class Server:
    archive: bytes
    requests: list[dict[str, str]] = field(default_factory=list)
    cut_first_at: int | None = None
    """Close the first answer's connection after this many bytes."""
    url: str = ""


@asynccontextmanager
async def serving(server: Server) -> AsyncIterator[Server]:
    async def archive(request: web.Request) -> web.StreamResponse:
        server.requests.append(dict(request.headers))
        data = server.archive
        start = 0
        ranged = request.headers.get("Range")
        if ranged:
            start = int(ranged.removeprefix("bytes=").split("-")[0])
        response = web.StreamResponse(status=206 if ranged else 200)
        response.content_length = len(data) - start
        response.content_type = "application/gzip"
        await response.prepare(request)
        if server.cut_first_at is not None and len(server.requests) == 1:
            await response.write(data[start : server.cut_first_at])
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write(data[start:])
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/aflow_data.tar.gz", archive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server.url = f"http://127.0.0.1:{runner.addresses[0][1]}/aflow_data.tar.gz"
    try:
        yield server
    finally:
        await runner.cleanup()


def _manifest(tmp_path: Path, url: str, *, wrong: str | None = None) -> Path:
    files = {
        name: {
            "sha256": "0" * 64 if name == wrong else hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
        }
        for name, data in FILES.items()
    }
    path = tmp_path / "manifest.json"
    path.write_text(json.dumps({"url": url, "archive": "aflow_data.tar.gz", "files": files}))
    return path


async def aflowrl(*argv: str) -> int:
    return await asyncio.to_thread(main, ["data", "download", "--no-progress", *argv])


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0]
    return lines[0]


async def test_download_verifies_unpacks_and_a_second_run_fetches_nothing(tmp_path, capsys):
    target = tmp_path / "data"
    async with serving(Server(_archive())) as server:
        manifest = _manifest(tmp_path, server.url)
        assert await aflowrl("--dir", str(target), "--manifest", str(manifest)) == ExitCode.OK
        assert sorted(p.name for p in target.iterdir()) == sorted(FILES)  # no README, no .part
        assert all((target / name).read_bytes() == data for name, data in FILES.items())
        assert "3 files downloaded and verified" in capsys.readouterr().err
        assert await aflowrl("--dir", str(target), "--manifest", str(manifest)) == ExitCode.OK
        assert len(server.requests) == 1
        assert "already in" in capsys.readouterr().err
    problems = get_benchmark("gsm8k").load("validate", target)
    assert [p.problem_id for p in problems] == ["v0"]


async def test_only_the_named_benchmarks_are_unpacked(tmp_path):
    target = tmp_path / "data"
    async with serving(Server(_archive())) as server:
        manifest = _manifest(tmp_path, server.url)
        args = ("--dir", str(target), "--manifest", str(manifest), "--benchmarks", "math")
        assert await aflowrl(*args) == ExitCode.OK
    assert [p.name for p in target.iterdir()] == ["math_validate.jsonl"]


async def test_a_file_that_fails_its_checksum_is_named_and_nothing_is_installed(tmp_path, capsys):
    target = tmp_path / "data"
    async with serving(Server(_archive())) as server:
        manifest = _manifest(tmp_path, server.url, wrong="gsm8k_test.jsonl")
        code = await aflowrl("--dir", str(target), "--manifest", str(manifest))
    assert code == ExitCode.DOWNLOAD
    line = _error_line(capsys)
    assert "checksum mismatch for gsm8k_test.jsonl" in line
    assert [p.name for p in target.iterdir()] == []


async def test_a_corrupt_local_file_is_replaced(tmp_path):
    target = tmp_path / "data"
    target.mkdir()
    (target / "gsm8k_test.jsonl").write_text("tampered\n")
    async with serving(Server(_archive())) as server:
        manifest = _manifest(tmp_path, server.url)
        assert await aflowrl("--dir", str(target), "--manifest", str(manifest)) == ExitCode.OK
    assert (target / "gsm8k_test.jsonl").read_bytes() == FILES["gsm8k_test.jsonl"]


async def test_an_http_error_is_one_line_naming_the_url(tmp_path, capsys):
    async with serving(Server(_archive())) as server:
        missing = server.url.replace("aflow_data", "elsewhere")
        manifest = _manifest(tmp_path, server.url)
        code = await aflowrl(
            "--dir", str(tmp_path / "d"), "--manifest", str(manifest), "--url", missing
        )
    assert code == ExitCode.DOWNLOAD
    line = _error_line(capsys)
    assert "HTTP 404" in line and missing in line and "--url" in line


async def test_no_server_is_one_line_saying_so(tmp_path, capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/aflow_data.tar.gz"
    manifest = _manifest(tmp_path, url)
    code = await aflowrl(
        "--dir", str(tmp_path / "d"), "--manifest", str(manifest), "--retries", "0"
    )
    assert code == ExitCode.DOWNLOAD
    assert "connection refused" in _error_line(capsys)


async def test_a_broken_off_download_is_resumed_with_a_range_request(tmp_path):
    target = tmp_path / "data"
    archive = _archive()
    async with serving(Server(archive, cut_first_at=len(archive) // 2)) as server:
        manifest = _manifest(tmp_path, server.url)
        assert await aflowrl("--dir", str(target), "--manifest", str(manifest)) == ExitCode.OK
    assert len(server.requests) == 2
    assert server.requests[1]["Range"] == f"bytes={len(archive) // 2}-"
    assert all((target / name).read_bytes() == data for name, data in FILES.items())


async def test_without_dir_the_files_go_where_the_loaders_look(tmp_path, monkeypatch):
    monkeypatch.delenv("AFLOWRL_DATA_DIR", raising=False)
    monkeypatch.setenv("AFLOWRL_CACHE_DIR", str(tmp_path / "cache"))
    async with serving(Server(_archive())) as server:
        monkeypatch.setenv("AFLOWRL_DATA_URL", server.url)
        manifest = _manifest(tmp_path, "http://127.0.0.1:9/never-used")
        assert await aflowrl("--manifest", str(manifest)) == ExitCode.OK
    assert (tmp_path / "cache" / "data" / "gsm8k_test.jsonl").is_file()
    assert [p.problem_id for p in get_benchmark("gsm8k").load("test")] == ["t0"]


async def test_a_directory_that_cannot_be_made_is_one_line(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    manifest = _manifest(tmp_path, "http://127.0.0.1:9/never-used")
    code = await aflowrl("--dir", str(blocker / "data"), "--manifest", str(manifest))
    assert code == ExitCode.DOWNLOAD
    assert "cannot write" in _error_line(capsys)


def test_the_shipped_manifest_matches_the_published_splits(aflow_data):
    from aflowrl.benchmarks import download

    manifest = download.Manifest.load()
    for entry in manifest.files:
        path = aflow_data / entry.name
        assert download.sha256_of(path) == entry.sha256, entry.name


async def test_a_file_url_mirror_works_offline(tmp_path):
    mirror = tmp_path / "mirror" / "aflow_data.tar.gz"
    mirror.parent.mkdir()
    mirror.write_bytes(_archive())
    manifest = _manifest(tmp_path, "http://127.0.0.1:9/never-used")
    target = tmp_path / "data"
    code = await aflowrl(
        "--dir", str(target), "--manifest", str(manifest), "--url", mirror.as_uri()
    )
    assert code == ExitCode.OK
    assert sorted(p.name for p in target.iterdir()) == sorted(FILES)
