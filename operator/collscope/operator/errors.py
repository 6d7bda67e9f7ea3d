"""Errors raised by the operator package.

Hierarchy::

    CollscopeError (collscope.nodeagent.errors)   root of everything collscope raises on purpose
    ├── BundleError(ValueError)                   bad trace bundle (from the agent's bundle module)
    ├── SimulationError(ValueError)               a simulation that cannot be built as asked
    ├── AnalysisError(ValueError)                 input that analysis cannot work with
    ├── ParallelismError(ValueError)              a declared parallelism that cannot be used
    ├── InvalidTransition(ValueError)             a Diagnosis phase change that is not allowed
    ├── SpecError(ValueError)                     a TrainingJob or Diagnosis not of its CRD's shape
    ├── RemediationError(ValueError)              node marks that cannot be planned or undone
    ├── PolicyError(ValueError)                   a policy or breaker setting out of range
    ├── SettingsError(ValueError)                 an environment variable or flag unusable, named
    │                                             (the agent's class: one for both binaries)
    ├── KubeError                                 the Kubernetes API failed (kube.py maps it)
    ├── PluginError(RuntimeError)                 the plugin .so missing or refusing a call (onebox)
    └── AgentError                                a node agent answered badly (agents.py maps it)
        └── AgentUnreachable                      ... or could not be reached at all

The root lives in the node agent because the operator may import the agent's public modules,
never the reverse; both packages then share one family, and the names that mean the same thing
on both sides are one class (``CollscopeError``, ``SettingsError``). The
agent's own refusals of a request are its ``ApiError``; ``AgentError`` here is the client's
view of them.
"""

from __future__ import annotations

from collscope.nodeagent import errors as agent_errors

CollscopeError = agent_errors.CollscopeError
SettingsError = agent_errors.SettingsError


class SimulationError(CollscopeError, ValueError):
    """A simulation was asked for something impossible (e.g. TP*PP*DP != ranks)."""


class AnalysisError(CollscopeError, ValueError):
    """Analysis cannot work with its input (e.g. a bundle with no ranks)."""


class ParallelismError(CollscopeError, ValueError):
    """A ``collscope.dev/parallelism`` annotation or ``spec.parallelism`` that cannot be used.

    ``str()`` names the text and what is wrong with it, e.g.
    ``parallelism 'tp=8,pp=x': 'pp' must be a positive integer (got 'x')``.
    """


class InvalidTransition(CollscopeError, ValueError):  # noqa: N818 - reads as a state-machine verdict
    """A Diagnosis phase change the state machine does not allow (e.g. Diagnosed -> Analyzing)."""


class SpecError(CollscopeError, ValueError):
    """A TrainingJob's or Diagnosis's ``spec`` or ``status`` with a value of the wrong type
    (``domain.resources`` parses them). ``str()`` names the resource and each field, e.g.
    ``TrainingJob spec.diagnosis.trigger.intervalSeconds: Input should be a valid number,
    unable to parse string as a number (got 'fast')``.
    """


class RemediationError(CollscopeError, ValueError):
    """A node remediation that cannot be planned or undone (e.g. a malformed record annotation)."""


class PolicyError(CollscopeError, ValueError):
    """A remediation policy or circuit-breaker setting that is out of range or unknown."""


class KubeError(CollscopeError):
    """The Kubernetes API answered with an unexpected error or could not be reached.

    Raised only by ``kube.py``, from the client's exception; event handlers log it (kopf does
    not retry them), cause handlers turn it into ``kopf.TemporaryError`` so kopf retries.
    """


class AgentError(CollscopeError):
    """A node agent answered with an error or with something that is not its v1 API.

    ``str()`` names the node, the URL and what was wrong (status and the agent's error text).
    Raised only by ``agents.py``, from the httpx or pydantic exception.
    """


class AgentUnreachable(AgentError):  # noqa: N818 - reads as the fact it reports
    """A node agent could not be reached (connection refused, timeout) after every retry."""


class PluginError(CollscopeError, RuntimeError):
    """The NCCL profiler plugin cannot be found or loaded, or refused a call (onebox)."""


class FabricError(CollscopeError, ConnectionError):
    """The one-box's rank-state fabric (``onebox.fabric``) could not be reached, or answered
    with something that is not its protocol; ``str()`` names the address and what was wrong.
    """
