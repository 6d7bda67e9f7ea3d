"""Errors raised by the operator package.

Hierarchy::

    CollscopeError (collscope.nodeagent.errors)   root of everything collscope raises on purpose
    ├── BundleError(ValueError)                   bad trace bundle (from the agent's bundle module)
    ├── SimulationError(ValueError)               a simulation that cannot be built as asked
    └── AnalysisError(ValueError)                 input that analysis cannot work with

The root lives in the node agent because the operator may import the agent's public modules,
never the reverse; both packages then share one family.
"""

from __future__ import annotations

from collscope.nodeagent import errors as agent_errors

CollscopeError = agent_errors.CollscopeError


class SimulationError(CollscopeError, ValueError):
    """A simulation was asked for something impossible (e.g. TP*PP*DP != ranks)."""


class AnalysisError(CollscopeError, ValueError):
    """Analysis cannot work with its input (e.g. a bundle with no ranks)."""
