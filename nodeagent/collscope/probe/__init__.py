"""The EROICA probe: the part of collscope that runs inside the training processes.

Standard library only, any Python >= 3.9 (an import-linter contract keeps it so): it is shipped
in the agent's image (``nodeagent/Dockerfile`` copies ``site/`` to ``/opt/collscope/probe``),
copied by the webhook's init container into each opted-in pod and put first on ``PYTHONPATH``
(``COLLSCOPE_PROBE=dormant``, ``injection.probe_env``), where Python's ``site`` module runs
``site/sitecustomize.py`` at start-up. That starts ``site/collscope_probe.py``, which sleeps
until the node agent arms it (``collscope.nodeagent.profiling``, ``POST /v1/profile``), then
samples the training thread's Python stack for a bounded window (and, in a process that has
imported torch and initialised CUDA, runs torch's profiler over it for kernels and copies) and
writes what it saw beside the arm file. The agent turns that into β, μ, sigma per function
(``collscope.nodeagent.patterns``).

``site/`` is a directory of top-level modules in the pod (``import collscope_probe``), and
``collscope.probe.site`` here (tests, the agent's constants, the bench).
"""
