"""collscope's probe hook, run by Python at start-up when this directory is on PYTHONPATH.

The webhook copies this directory into the pod's plugin volume and injects it
(``PYTHONPATH=<this dir>[:the image's PYTHONPATH]``, ``COLLSCOPE_PROBE=dormant``,
``COLLSCOPE_TRACE_DIR``). ``COLLSCOPE_PROBE``:

- ``dormant`` (or unset): ``collscope_probe.start()``, the standard-library probe that sleeps
  until the node agent arms it (``probe.arm`` in the trace directory);
- ``0`` / ``off``: nothing (pods annotated ``collscope.dev/probe: "off"``).

It then runs the next ``sitecustomize`` on ``sys.path`` (the image's own, if any), which this
file would otherwise hide. Standard library only, Python >= 3.9. Nothing here may raise:
training must start whatever happens.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _dormant() -> None:
    try:
        import collscope_probe  # type: ignore[import-not-found]  # beside this file, on PYTHONPATH

        collscope_probe.start()
    except Exception:
        return


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        try:
            if os.path.abspath(entry or ".") == here:
                continue
            path = os.path.join(entry or ".", "sitecustomize.py")
            if os.path.isfile(path):
                spec = importlib.util.spec_from_file_location("_collscope_next_sitecustomize", path)
                if spec is not None and spec.loader is not None:
                    spec.loader.exec_module(importlib.util.module_from_spec(spec))
                return
        except Exception:
            return


_dormant()
_chain()
