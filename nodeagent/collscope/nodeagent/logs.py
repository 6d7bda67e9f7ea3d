"""Logging set up once by a binary's ``main()``: level and format (``text`` or ``json``).

Both ``collscope-agent`` and ``collscope-operator`` call ``configure`` with their settings
(``COLLSCOPE_LOG_LEVEL``, ``COLLSCOPE_LOG_FORMAT``, or ``--log-level``/``--log-format``). It
puts one stderr handler on the root logger, so every library logger that propagates, kopf's
own (``kopf.*``, ``kopf.objects``) included, comes out at the same level in the same format.
The node agent never imports the operator; the operator imports this module.

A text line::

    2025-01-31T10:00:00.123Z INFO collscope.operator.controller.trigger_loop [ml/llama] trigger: ...

A JSON line (one object per line, as log collectors expect)::

    {"time": "2025-01-31T10:00:00.123Z", "level": "INFO", "logger": "kopf.objects",
     "message": "Handler 'x' succeeded.", "object": {"namespace": "ml", "name": "llama", ...}}

``object`` is kopf's ``k8s_ref`` (the resource a handler's log line is about), when present.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Final, Literal, TextIO, cast

LogFormat = Literal["text", "json"]
LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS: Final = ("text", "json")
# Chatty below WARNING (httpx logs every request at INFO: one per agent per tick): held at
# WARNING unless the level is DEBUG (kopf's own CLI silences asyncio the same way).
_QUIET: Final = ("asyncio", "httpx", "httpcore", "urllib3", "kubernetes.client.rest")


def _utc(record: logging.LogRecord) -> str:
    t = time.gmtime(record.created)
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + f".{int(record.msecs):03d}Z"


def _ref(record: logging.LogRecord) -> dict[str, object] | None:
    ref = getattr(record, "k8s_ref", None)
    return cast(dict[str, object], ref) if isinstance(ref, dict) else None


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER [namespace/name] message``, then the traceback if any."""

    def format(self, record: logging.LogRecord) -> str:
        ref = _ref(record)
        where = ""
        if ref is not None:
            ns, name = ref.get("namespace") or "", ref.get("name") or ""
            where = f"[{ns}/{name}] " if ns else f"[{name}] "
        line = f"{_utc(record)} {record.levelname} {record.name} {where}{record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, object, exception."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "time": _utc(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = _ref(record)
        if ref is not None:
            doc["object"] = ref
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def formatter(fmt: LogFormat) -> logging.Formatter:
    return JsonFormatter() if fmt == "json" else TextFormatter()


def configure(level: str, fmt: LogFormat, *, stream: TextIO | None = None) -> None:
    """Root logger at ``level`` with one handler writing ``fmt`` to ``stream`` (stderr).

    Replaces the handlers a previous call (or ``logging.basicConfig``) left on the root.
    """
    if level.upper() not in LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LEVELS)}, not {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log format must be 'text' or 'json', not {fmt!r}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet = logging.NOTSET if root.level <= logging.DEBUG else max(logging.WARNING, root.level)
    for name in _QUIET:
        logging.getLogger(name).setLevel(quiet)
