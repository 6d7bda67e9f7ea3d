"""The trace ring reader: the files the native profiler plugin writes, one per training process.

The public surface is what this module names, and code outside the node agent (the operator's
``collscope ring dump``) uses nothing else (an import-linter contract in pyproject.toml)::

    from collscope.nodeagent import ring

    with ring.open("/run/collscope/collscope-node7-pid4242-0.ring") as r:   # -> ring.Ring
        r.identity                                   # ring.Identity: who wrote it
        snap = r.snapshot()                          # live state, seqlock-consistent
        events, cursor, missed = r.events_since(0)   # completion + communicator records

    for d in ring.dump(paths):                       # the rings of one job -> ring.Dump
        d.records                                    # docs/spec/bundle-v1.md comm, op, state
        d.summary()                                  # a few lines for a person

The modules inside, for the node agent's own use:

- ``reader``: ``open`` and ``Ring``: takes a regular file, checks its header, copies with
  ``pread``, never a mapping
- ``layout``: the binary layout, mirrored from ``native/include/collscope_ring.h``, and the
  value domains a read is checked against
- ``livestate``: the live-state region: seqlock copies of the comm, op and flow slots, decoded
- ``eventlog``: the event region: completion and communicator records
- ``records``: ring contents as bundle-v1 records, slot by slot (the reference, and ``dump``)
- ``staterows``, ``eventrows``: the same contents as window table rows, vectorised (the
  agent's 10 Hz sampler)
"""

from __future__ import annotations

from collscope.nodeagent.ring.reader import Identity, Ring, open
from collscope.nodeagent.ring.records import Dump, dump

__all__ = ["Dump", "Identity", "Ring", "dump", "open"]
