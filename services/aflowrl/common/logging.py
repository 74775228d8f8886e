"""Logging setup for every aflow-rl process: readable text locally, JSON lines in pods.

Modules log with ``logger = logging.getLogger(__name__)`` and %-style arguments. The request id
of the gRPC call being served (set by :mod:`aflowrl.common.interceptors`) is added to each record.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from pathlib import Path

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "aflowrl_request_id", default=None
)
"""Id of the gRPC request the current task serves (None outside a request)."""


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request id, exception."""

    def __init__(self, component: str | None = None) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if self.component:
            entry["component"] = self.component
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``time level logger [request id] message``."""

    def __init__(self, component: str | None = None) -> None:
        prefix = f"{component} " if component else ""
        super().__init__(f"%(asctime)s %(levelname)-7s {prefix}%(name)s%(rid)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        request_id = getattr(record, "request_id", None)
        record.rid = f" [{request_id}]" if request_id else ""
        return super().format(record)


def setup_logging(
    level: str = "INFO",
    fmt: str = "text",
    component: str | None = None,
    *,
    file: str | Path | None = None,
) -> None:
    """Configure the root logger once per process (idempotent).

    With ``file`` (a local run's log), records go to that file and only warnings and errors to
    stderr, where a progress bar is drawn.
    """
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_aflowrl", False):
            root.removeHandler(handler)
            handler.close()
    formatter = JsonFormatter(component) if fmt == "json" else TextFormatter(component)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if file is not None:
        Path(file).parent.mkdir(parents=True, exist_ok=True)
        handlers[0].setLevel(logging.WARNING)
        handlers.append(logging.FileHandler(file, encoding="utf-8"))
    for handler in handlers:
        handler._aflowrl = True  # type: ignore[attr-defined]
        handler.addFilter(_RequestIdFilter())
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level.upper())
    # gRPC's and aiohttp's access chatter is not useful at INFO.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
