"""The EROICA probe: runs inside the training process, off unless ``COLLSCOPE_PROBE=1``.

Injected without code changes: the webhook puts ``site/`` (whose ``sitecustomize.py`` calls
``install.install()``) on the pod's ``PYTHONPATH``. The probe never imports torch itself
until the training code does (``install``), never raises into user code, and does nothing
when torch is missing. Modules: ``config`` (environment), ``iteration`` (iteration and
degradation detection, §4.1), ``runtime`` (the per-process state machine: watch, request,
profile, summarise), ``coordinate`` (the request file in the trace directory), ``trace``
(torch.profiler's Chrome trace), ``sampler`` (CPU utilisation), ``critical`` (Algorithm 1),
``summarise`` (β, μ, sigma per critical-path function, §4.2) and ``collect`` (the agent's side:
the probes' files as the lines of a bundle's ``functions.jsonl``).
"""
