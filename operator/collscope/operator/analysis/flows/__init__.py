"""Black-box diagnosis from network flows alone (LLMPrism, ``papers/llmprism.txt`` §IV).

``engine.diagnose_flows(flows, settings, job=...)`` is the entry point; the modules follow the
paper's phases: ``topology`` and ``jobs`` (Algorithm 1), ``bocd`` and ``parallelism``
(Algorithm 2), ``timeline`` (§IV-C), ``ksigma``, ``findings`` and ``explain`` (§IV-D). ``table``
holds the flows in columnar form.
"""
