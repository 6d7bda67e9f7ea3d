"""The EROICA probes that run inside the training process.

Two of them. The one a live job gets (issue 18) is ``site/collscope_probe.py``: standard
library only, copied by the webhook's init container into the pod and started by
``site/sitecustomize.py`` from ``PYTHONPATH`` (``COLLSCOPE_PROBE=dormant``). It sleeps until the
node agent arms it (``collscope.nodeagent.profiling``, ``POST /v1/profile``), then samples the
training thread's Python stack for a bounded window; the agent turns the samples into β, μ,
sigma per function with ``summarise`` and ``critical`` (Algorithm 1).

The other, ``install`` + ``runtime`` (``COLLSCOPE_PROBE=1``, and collscope with numpy installed
in the training image), hooks torch itself: iteration and degradation detection (``iteration``,
§4.1), requests between ranks through the trace directory (``coordinate``), torch.profiler's
Chrome trace (``trace``), CPU utilisation (``sampler``), and per-function patterns written as
``functions.<rank>.jsonl`` (``summarise``), which ``collect`` reads as the lines of a bundle's
``functions.jsonl``. Nothing on the agent writes the ``hw.<rank>.jsonl`` it can read, so its
kernels and collectives get μ = sigma = 0. It never raises into user code, and does nothing
when torch is missing.
"""
