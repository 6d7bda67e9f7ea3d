"""collscope's probe hook, run by Python at start-up when this directory is on PYTHONPATH.

The webhook injects it (PYTHONPATH=<this dir>, COLLSCOPE_PROBE=1, COLLSCOPE_TRACE_DIR); pods
annotated ``collscope.dev/probe: "off"`` get COLLSCOPE_PROBE=0 and the probe stays off. It then
runs the next ``sitecustomize`` on ``sys.path`` (the image's own, if any), which this file
would otherwise hide. Nothing here may raise: training must start whatever happens.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def _install() -> None:
    if os.environ.get("COLLSCOPE_PROBE") != "1":
        return
    try:
        from collscope.nodeagent.probe import install

        install.install()
    except Exception:  # not installed in this image, or anything else: training goes on
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


_install()
_chain()
