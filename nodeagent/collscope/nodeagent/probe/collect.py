"""The agent's side of the hand-over: the ``functions.<rank>.jsonl`` files probes left in trace
directories, validated, as the lines of a bundle's ``functions.jsonl`` (docs/spec/bundle-v1.md).

A file being replaced is read whole or not at all (the probe renames complete files into
place); a line that does not validate is skipped and counted, never fatal: one broken probe
must not cost the patterns of the others.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import pydantic

from collscope.nodeagent.bundle import models


@dataclass
class Collected:
    patterns: list[models.FunctionPattern] = field(default_factory=list)
    files: int = 0
    bad_lines: int = 0

    def lines(self) -> str:
        """The text of ``functions.jsonl``: one compact JSON object per line."""
        return "".join(p.model_dump_json() + "\n" for p in self.patterns)


def collect(trace_dirs: Iterable[str]) -> Collected:
    out = Collected()
    for d in trace_dirs:
        for path in sorted(glob.glob(os.path.join(d, "functions.*.jsonl"))):
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            out.files += 1
            for line in text.splitlines():
                if not line.strip():
                    continue
                try:
                    out.patterns.append(models.FunctionPattern.model_validate_json(line))
                except pydantic.ValidationError:
                    out.bad_lines += 1
    return out
