"""Behaviour patterns of functions (EROICA §4.2): β, μ, sigma from events and utilisation
samples (``summarise``), with Algorithm 1's critical execution duration (``critical``).

The agent's half of profiling: ``collscope.nodeagent.profiling`` turns what the in-process
probe (``collscope.probe``) wrote into events and samples and calls ``summarise.summarise``.
It runs in the agent, never in the training process (numpy).
"""
