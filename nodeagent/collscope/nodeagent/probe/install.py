"""Installing the probe into a training process: environment, torch hooks, watchdog.

``install(env)`` (from ``site/sitecustomize.py``) reads ``config.ProbeSettings`` once and,
when enabled, waits for the training code to import torch: a ``sys.meta_path`` finder wraps
the loader of the ``torch`` module so that, right after ``import torch`` finishes, the probe
patches ``torch.utils.data.dataloader._BaseDataLoaderIter.__next__`` (every DataLoader
iterator, single- and multi-process) and registers a global optimizer step post-hook
(``torch.optim.optimizer.register_optimizer_step_post_hook``, torch >= 2.0). Nothing of torch
is imported before the user's code does; without torch, or without that hook API, the probe
stays off. Every step is guarded: install never raises.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from typing import Any

from collscope.nodeagent.probe import config

_state: dict[str, Any] = {}


def install(env: Mapping[str, str] | None = None) -> bool:
    """Arm the probe; True when it is armed (or attached already). Never raises."""
    try:
        s = config.ProbeSettings.from_env(os.environ if env is None else env)
        if not s.enabled or "probe" in _state or "settings" in _state:
            return "probe" in _state or "settings" in _state
        _state["settings"] = s
        if "torch" in sys.modules:
            return attach(sys.modules["torch"])
        sys.meta_path.insert(0, _TorchFinder())
        return True
    except Exception:
        return False


def attach(torch: Any) -> bool:
    """Patch an imported torch (see module docstring); False when it cannot be."""
    try:
        if "probe" in _state:
            return True
        from collscope.nodeagent.probe import runtime  # numpy and friends: only now

        optim = importlib.import_module("torch.optim.optimizer")
        loader = importlib.import_module("torch.utils.data.dataloader")
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        loader_iter = loader._BaseDataLoaderIter
        if register is None:
            return False
        p = runtime.Probe(_state["settings"], torch)
        original = loader_iter.__next__

        @functools.wraps(original)
        def probed_next(self: Any) -> Any:
            p.on_event("next")
            return original(self)

        loader_iter.__next__ = probed_next
        register(lambda opt, args, kwargs: p.on_event("step"))
        stop = threading.Event()
        threading.Thread(target=p.watch, args=(stop,), name="collscope-watch", daemon=True).start()
        _state.update(probe=p, stop=stop)
        atexit.register(_flush, p)
        return True
    except Exception:
        return False


def _flush(p: Any, timeout_s: float = 30.0) -> None:
    """At exit: let the summaries of a finished window reach the trace directory."""
    try:
        for t in list(p.summaries):
            t.join(timeout=timeout_s)
    except Exception:
        return


def probe() -> Any:
    """The installed ``runtime.Probe`` (None before torch was imported or when off)."""
    return _state.get("probe")


class _TorchFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of ``torch`` to attach after it ran.

    It stays on ``sys.meta_path`` until torch is executed: libraries probe for torch with
    ``importlib.util.find_spec`` before importing it, and such a spec is never executed.
    """

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        real = spec.loader
        finder = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
                return real.create_module(spec)

            def exec_module(self, module: types.ModuleType) -> None:
                real.exec_module(module)
                if finder in sys.meta_path:
                    sys.meta_path.remove(finder)
                attach(module)

        spec.loader = _Loader()
        return spec
