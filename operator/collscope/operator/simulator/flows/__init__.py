"""A flow simulator: several training jobs on one leaf-spine fabric, as a collector sees them.

``engine.simulate(config.preset(gpus, faults=...))`` runs ``pipeline`` (one job's 1F1B steps and
DP ring) for every job on ``fabric`` (paths, ECMP, rates, faults), then ``collector`` (record
loss and splits, timing noise, storage traffic); ``truth`` is what analysis must find.
"""
