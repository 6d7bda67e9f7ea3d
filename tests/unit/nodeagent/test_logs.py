"""logs.configure: one root handler, text or JSON lines, kopf's object reference kept."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from collscope.nodeagent import logs


@pytest.fixture(autouse=True)
def _restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("httpx", "asyncio"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_text_lines_at_the_level_with_the_object_prefix() -> None:
    out = io.StringIO()
    logs.configure("info", "text", stream=out)
    logging.getLogger("collscope.operator.controller.trigger_loop").debug("not shown")
    ref = {"namespace": "ml", "name": "llama", "kind": "TrainingJob"}
    logging.getLogger("kopf.objects").info("Handler succeeded.", extra={"k8s_ref": ref})
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(" INFO kopf.objects [ml/llama] Handler succeeded.")


def test_json_lines_carry_level_logger_object_and_traceback() -> None:
    out = io.StringIO()
    logs.configure("DEBUG", "json", stream=out)
    ref = {"namespace": "ml", "name": "llama"}
    logging.getLogger("kopf.objects").warning("x=%d", 3, extra={"k8s_ref": ref})
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("collscope.operator").exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines()[:2])
    assert first["level"] == "WARNING" and first["logger"] == "kopf.objects"
    assert first["message"] == "x=3" and first["object"] == ref
    assert first["time"].endswith("Z")
    assert "ValueError: boom" in second["exception"]


def test_configure_replaces_handlers_and_quiets_httpx_above_debug() -> None:
    logs.configure("INFO", "text", stream=io.StringIO())
    logs.configure("INFO", "json", stream=io.StringIO())
    assert len(logging.getLogger().handlers) == 1
    assert logging.getLogger("httpx").level == logging.WARNING  # a request line per agent poll
    logs.configure("DEBUG", "text", stream=io.StringIO())
    assert logging.getLogger("httpx").level == logging.NOTSET


def test_bad_level_or_format_is_refused() -> None:
    with pytest.raises(ValueError, match="log level"):
        logs.configure("LOUD", "text")
    with pytest.raises(ValueError, match="log format"):
        logs.configure("INFO", "xml")  # type: ignore[arg-type]
