"""The pod contract: what the operator's webhook puts into a training pod and what the node
agent, the NCCL plugin and the probe expect to find there (docs/design.md, "Contracts").

Written here once: ``collscope.operator.domain.injection`` builds the webhook's patch from these
names, the agent's ``settings`` and ``discovery`` look for rings with them (the operator may
import the agent, never the reverse). The C plugin reads the same variables (``native/src/ring.c``,
``chain.c``) and the probe's standard-library site module repeats the two it needs
(``probe/site/collscope_probe.py``: it runs in the training process, without collscope).

An opted-in pod, as the webhook leaves it::

    volumes:  collscope-trace   emptyDir {medium: Memory}, mounted at /run/collscope
    env:      COLLSCOPE_TRACE_DIR=/run/collscope           where the plugin writes its ring
              POD_NAME POD_NAMESPACE NODE_NAME              downward API, into the ring header
              NCCL_PROFILER_PLUGIN=<plugin dir>/libnccl-profiler-collscope.so
              COLLSCOPE_NEXT_PROFILER_PLUGIN               the pod's own plugin, if it had one
              COLLSCOPE_PROBE=dormant                      the probe waits to be armed
              TORCH_NCCL_DEBUG_INFO_PIPE_FILE=/run/collscope/fr_pipe_rank_
              COLLSCOPE_RING_BYTES                          only when the operator sets a size

On the node the kubelet keeps the trace volume at
``<kubelet pods dir>/<pod uid>/volumes/kubernetes.io~empty-dir/collscope-trace/``, where the
agent finds the rings (``discovery``).
"""

from __future__ import annotations

from typing import Final

TRACE_VOLUME: Final = "collscope-trace"  # the emptyDir holding the rings
TRACE_DIR: Final = "/run/collscope"  # its mount path in every app container
TRACE_DIR_ENV: Final = "COLLSCOPE_TRACE_DIR"
RING_BYTES_ENV: Final = "COLLSCOPE_RING_BYTES"  # unset: the plugin's default size

# The ring header's identity: the plugin copies these into it (native/src/ring.c).
POD_NAME_ENV: Final = "POD_NAME"
POD_NAMESPACE_ENV: Final = "POD_NAMESPACE"
NODE_NAME_ENV: Final = "NODE_NAME"
# Each variable with the downward-API field the webhook fills it from.
DOWNWARD_API: Final = (
    (POD_NAME_ENV, "metadata.name"),
    (POD_NAMESPACE_ENV, "metadata.namespace"),
    (NODE_NAME_ENV, "spec.nodeName"),
)

PLUGIN_ENV: Final = "NCCL_PROFILER_PLUGIN"  # NCCL's own variable
NEXT_PLUGIN_ENV: Final = "COLLSCOPE_NEXT_PROFILER_PLUGIN"  # the plugin forwards to it (chain.c)
PROBE_ENV: Final = "COLLSCOPE_PROBE"
PROBE_DORMANT: Final = "dormant"  # the probe sleeps until the agent arms it
# torch's Flight Recorder debug pipe: <stem><rank>.pipe, written by the agent to ask for a dump.
FR_PIPE_ENV: Final = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
