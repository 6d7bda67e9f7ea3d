"""progress.Progress: a bar on a terminal, nothing when stderr is piped."""

from __future__ import annotations

import io

from collscope.operator.cli import progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_silent_when_the_stream_is_not_a_terminal() -> None:
    out = io.StringIO()
    bar = progress.Progress("simulating", stream=out)
    assert not bar.enabled
    assert list(bar.count(iter("abc"), 3)) == ["a", "b", "c"]
    assert out.getvalue() == ""


def test_draws_at_most_every_interval_and_ends_the_line() -> None:
    out, now = _Tty(), [0.0]
    bar = progress.Progress("sim", stream=out, every_s=1.0, clock=lambda: now[0])
    bar(0.01)  # first call draws; too early to estimate
    now[0] = 0.5
    bar(0.2)  # within the interval: not drawn
    now[0] = 2.0
    bar(0.5)
    bar.done()
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) == 3
    assert "estimating" in frames[0]
    assert "[##########..........]  50%  2s elapsed, ~2s left" in frames[1]
    assert "100%" in frames[2] and frames[2].endswith("\n")
