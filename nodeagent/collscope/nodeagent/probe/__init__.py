"""The EROICA probe that runs inside the training process, and the agent's pattern math.

The probe a live job gets (issue 18) is ``site/collscope_probe.py``: standard library only,
copied by the webhook's init container into the pod and started by ``site/sitecustomize.py``
from ``PYTHONPATH`` (``COLLSCOPE_PROBE=dormant``). It sleeps until the node agent arms it
(``collscope.nodeagent.profiling``, ``POST /v1/profile``), then samples the training thread's
Python stack for a bounded window; the agent turns the samples into β, μ, sigma per function
with ``summarise`` and ``critical`` (Algorithm 1).
"""
