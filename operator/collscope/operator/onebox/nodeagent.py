"""A one-box node agent: ``collscope-agent run`` with the node's hardware simulated.

::

    python -m collscope.operator.onebox.nodeagent --hw-root DIR [collscope-agent run flags]

The real agent (``collscope.nodeagent.__main__.main``) with the node injected: its hardware
sampler reads ``DIR`` (``hardware.NodeHardware``: a sysfs tree and ``FileNvml``) instead of
NVML and the host's sysfs, and its ``/proc`` is ``DIR/proc`` (the node's rank processes, each
in its pod's cgroup). Set ``COLLSCOPE_SYS_ROOT=DIR/sys`` as well, so that the device map
finds the simulated HCAs beside the simulated GPUs (``box.OneBox.start_agent`` does).
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence

from collscope.nodeagent import __main__ as agent_cli
from collscope.nodeagent import settings
from collscope.nodeagent.hardware import sampler
from collscope.operator.onebox import hardware


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="onebox-agent", description=__doc__.split("\n\n")[0])
    p.add_argument("--hw-root", type=pathlib.Path, required=True, help="a NodeHardware tree")
    known, rest = p.parse_known_args(argv)
    node_hw = hardware.NodeHardware(known.hw_root)

    def make(config: settings.Settings) -> sampler.Sampler:
        return node_hw.sampler(
            config.node_name,
            interval_s=config.hardware.hw_interval_s,
            history_s=config.window.window_s,
        )

    return agent_cli.main(rest, hardware=make, proc_root=node_hw.proc_root)


if __name__ == "__main__":
    raise SystemExit(main())
