"""``aflowrl data download``: fetch AFlow's published benchmark splits, verified.

AFlow (FoundationAgents/AFlow, ``data/download_data.py``) publishes its validation and test
splits as one ``tar.gz``. The manifest shipped beside this module (``aflow_data.json``) names its
URL and the SHA-256 and size of every split file; tests and mirrors pass their own manifest or
URL. :func:`download`:

- keeps every wanted file already in the directory whose checksum matches (idempotent: a second
  run downloads nothing);
- otherwise downloads the archive next to the files (``.aflow_data.tar.gz.part``), resuming a
  partial download with an HTTP Range request, and retrying network failures and 5xx answers a
  few times with growing pauses; 4xx answers are not retried;
- takes from the archive only the wanted files (matched by name, wherever they sit in it, never
  by the archive's paths), checks each one's SHA-256 before it replaces anything, and moves it
  into place atomically;
- raises :class:`~aflowrl.benchmarks.errors.DownloadUnavailableError` (try again later) or
  :class:`~aflowrl.benchmarks.errors.DownloadFailedError` (will fail the same way), each one line
  naming the URL or file, the cause and the fix.

Only ``http(s)://`` and ``file://`` URLs are read (urllib, no extra dependency).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aflowrl.benchmarks.errors import DownloadFailedError, DownloadUnavailableError
from aflowrl.errors import InvalidInputError

logger = logging.getLogger(__name__)

MANIFEST = Path(__file__).with_name("aflow_data.json")
"""The shipped manifest: AFlow's archive URL and the checksum of each split file."""

_CHUNK = 1 << 16
_USER_AGENT = "aflow-rl data download"


@dataclass(frozen=True)
class DataFile:
    """One split file the archive must hold."""

    name: str
    sha256: str
    size: int | None = None


@dataclass(frozen=True)
class Manifest:
    """What to fetch and how to check it."""

    url: str
    archive: str
    files: tuple[DataFile, ...]

    @classmethod
    def load(cls, path: Path = MANIFEST) -> Manifest:
        """A manifest file: ``{"url", "archive", "files": {name: {"sha256", "bytes"}}}``."""
        try:
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            files = tuple(
                DataFile(name, str(entry["sha256"]).lower(), entry.get("bytes"))
                for name, entry in doc["files"].items()
            )
            return cls(str(doc["url"]), str(doc.get("archive") or "aflow_data.tar.gz"), files)
        except OSError as exc:
            raise InvalidInputError(
                f"{path}: cannot read ({exc.strerror})", field="--manifest"
            ) from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInputError(
                f"{path}: not a data manifest ({type(exc).__name__}: {exc})", field="--manifest"
            ) from None

    def select(self, benchmarks: Iterable[str] | None) -> tuple[DataFile, ...]:
        """The files of these benchmarks (all when None)."""
        if benchmarks is None:
            return self.files
        wanted = list(benchmarks)
        known = sorted({f.name.split("_", 1)[0] for f in self.files})
        unknown = [b for b in wanted if b not in known]
        if unknown:
            raise InvalidInputError(
                f"no files of {', '.join(unknown)} in the manifest (it has {', '.join(known)})",
                field="--benchmarks",
            )
        return tuple(f for f in self.files if f.name.split("_", 1)[0] in wanted)


@dataclass(frozen=True)
class Outcome:
    """What :func:`download` did."""

    directory: Path
    kept: tuple[str, ...]
    """Files already there and verified."""
    fetched: tuple[str, ...]
    """Files taken from the downloaded archive, verified."""


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _verified(path: Path, expected: DataFile) -> bool:
    if not path.is_file():
        return False
    if expected.size is not None and path.stat().st_size != expected.size:
        return False
    return sha256_of(path) == expected.sha256


def download(
    directory: Path,
    *,
    manifest: Manifest | None = None,
    url: str | None = None,
    benchmarks: Iterable[str] | None = None,
    retries: int = 3,
    retry_delay_s: float = 2.0,
    timeout_s: float = 60.0,
    progress: Callable[[int, int | None], None] | None = None,
) -> Outcome:
    """Make ``directory`` hold the manifest's files (those of ``benchmarks``), verified.

    ``url`` overrides the manifest's (a mirror); ``progress(done_bytes, total_bytes)`` is called
    as the archive arrives."""
    manifest = manifest or Manifest.load()
    wanted = manifest.select(benchmarks)
    directory = Path(directory).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _disk_error(directory, exc) from None
    kept = tuple(f.name for f in wanted if _verified(directory / f.name, f))
    missing = [f for f in wanted if f.name not in kept]
    if not missing:
        return Outcome(directory, kept, ())
    for stale in (f for f in missing if (directory / f.name).exists()):
        logger.warning("%s does not match its checksum: fetching it again", directory / stale.name)
    source = url or manifest.url
    part = directory / f".{manifest.archive}.part"
    _fetch(
        source,
        part,
        retries=retries,
        retry_delay_s=retry_delay_s,
        timeout_s=timeout_s,
        progress=progress,
    )
    fetched = _unpack(part, source, directory, missing)
    part.unlink(missing_ok=True)
    return Outcome(directory, kept, tuple(fetched))


def _disk_error(path: Path, exc: OSError) -> DownloadFailedError:
    return DownloadFailedError(
        f"cannot write {path}: {exc.strerror or exc}; free some space or choose another "
        "directory (--dir)"
    )


def _fetch(
    url: str,
    part: Path,
    *,
    retries: int,
    retry_delay_s: float,
    timeout_s: float,
    progress: Callable[[int, int | None], None] | None,
) -> None:
    """The archive at ``url`` into ``part``, resuming what is there; retries transient errors."""
    for attempt in range(retries + 1):
        try:
            _fetch_once(url, part, timeout_s=timeout_s, progress=progress)
            return
        except DownloadUnavailableError as exc:
            if attempt == retries:
                raise
            delay = retry_delay_s * 2**attempt
            logger.warning("%s; retry %d of %d in %.0f s", exc, attempt + 1, retries, delay)
            time.sleep(delay)


def _fetch_once(
    url: str,
    part: Path,
    *,
    timeout_s: float,
    progress: Callable[[int, int | None], None] | None,
) -> None:
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
    if have and url.startswith(("http://", "https://")):
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:
        if exc.code == 416:  # the part file is already whole (or longer than the archive)
            return
        raise _http_error(url, exc.code, exc.reason) from None
    except urllib.error.URLError as exc:
        raise _network_error(url, exc.reason) from None
    except (TimeoutError, ConnectionError) as exc:
        raise _network_error(url, exc) from None
    except ValueError as exc:  # urllib's "unknown url type"
        raise InvalidInputError(
            f"{url!r} is no http(s):// or file:// URL ({exc})", field="--url"
        ) from None
    with response:
        status = getattr(response, "status", 200) or 200
        resumed = status == 206
        if not resumed:
            have = 0
        kind = response.headers.get("Content-Type", "") or ""
        if kind.startswith("text/html"):
            raise DownloadUnavailableError(
                f"{url} sent a web page, not the archive (a download quota or a sign-in page); "
                "try again later, or use a mirror (--url or AFLOWRL_DATA_URL)"
            )
        length = response.headers.get("Content-Length")
        total = have + int(length) if length and length.isdigit() else None
        try:
            with part.open("ab" if resumed else "wb") as out:
                _copy(response, out, have=have, total=total, url=url, progress=progress)
        except OSError as exc:
            if isinstance(exc, (TimeoutError, ConnectionError)):
                raise _network_error(url, exc) from None
            raise _disk_error(part, exc) from None


def _copy(
    response: IO[bytes],
    out: IO[bytes],
    *,
    have: int,
    total: int | None,
    url: str,
    progress: Callable[[int, int | None], None] | None,
) -> None:
    done = have
    while True:
        try:
            block = response.read(_CHUNK)
        except (TimeoutError, ConnectionError, OSError) as exc:
            raise _network_error(url, exc) from None
        if not block:
            break
        out.write(block)
        done += len(block)
        if progress is not None:
            progress(done, total)
    if total is not None and done < total:
        raise DownloadUnavailableError(
            f"{url}: the connection closed after {done} of {total} bytes; run the command "
            "again to resume"
        )


def _http_error(
    url: str, status: int, reason: Any
) -> DownloadFailedError | DownloadUnavailableError:
    where = f"HTTP {status} ({reason}) from {url}"
    if status >= 500 or status == 429:
        return DownloadUnavailableError(f"{where}: the server is failing; try again later")
    return DownloadFailedError(
        f"{where}: the archive is not there; check the URL, or use a mirror (--url or "
        "AFLOWRL_DATA_URL)"
    )


def _network_error(url: str, reason: Any) -> DownloadUnavailableError:
    if isinstance(reason, socket.gaierror):
        cause = "host not found (no network, or no DNS)"
    elif isinstance(reason, ConnectionRefusedError):
        cause = "connection refused"
    elif isinstance(reason, (TimeoutError, socket.timeout)):
        cause = "timed out"
    elif isinstance(reason, OSError) and reason.strerror:
        cause = reason.strerror
    else:
        cause = str(reason) or type(reason).__name__
    return DownloadUnavailableError(
        f"cannot download {url}: {cause}; check the network, or use a mirror (--url or "
        "AFLOWRL_DATA_URL)"
    )


def _unpack(archive: Path, url: str, directory: Path, wanted: list[DataFile]) -> list[str]:
    """Move the ``wanted`` files out of ``archive`` into ``directory``, each verified first."""
    by_name = {f.name: f for f in wanted}
    staged: dict[str, Path] = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = Path(member.name).name
                if name not in by_name or name in staged or not member.isfile():
                    continue
                source = tar.extractfile(member)
                if source is None:
                    continue
                temp = directory / f".{name}.tmp"
                with source, temp.open("wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
                staged[name] = temp
                expected = by_name[name]
                got = sha256_of(temp)
                if got != expected.sha256:
                    raise DownloadFailedError(
                        f"checksum mismatch for {name} in {url}: expected sha256 "
                        f"{expected.sha256}, got {got}; the archive or the mirror is not the "
                        "published one"
                    )
    except (tarfile.TarError, EOFError, OSError) as exc:
        _discard(staged.values())
        archive.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, tarfile.TarError) and exc.errno:
            raise _disk_error(directory, exc) from None
        raise DownloadFailedError(
            f"{url} is no readable tar archive ({type(exc).__name__}: {exc}); the download was "
            "removed: run the command again, or use a mirror (--url)"
        ) from None
    except DownloadFailedError:
        _discard(staged.values())
        archive.unlink(missing_ok=True)
        raise
    absent = sorted(set(by_name) - set(staged))
    if absent:
        _discard(staged.values())
        raise DownloadFailedError(
            f"{url} has no {', '.join(absent)}; the archive is not AFlow's data archive "
            "(check --url)"
        )
    for name, temp in staged.items():
        os.replace(temp, directory / name)
    return sorted(staged)


def _discard(paths: Iterable[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)
