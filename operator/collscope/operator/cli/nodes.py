"""The cluster side of the ``collscope`` command (``uncordon`` and ``breaker``).

    collscope uncordon NODE          # remove the marks collscope placed on NODE, and only those
    collscope breaker show           # the cordon circuit breaker's state (ConfigMap)
    collscope breaker reset --by me  # a human closes a tripped breaker

They talk to the cluster of the current kubeconfig context (or the pod's service account)
through ``kube.Cluster`` and reuse ``remediator.Remediator``. ``uncordon`` is the one way a node
collscope marked goes back into the pool (deleting the job or its Diagnosis keeps the marks): it
removes exactly what collscope added (a node someone else cordoned stays cordoned), sets the
``CollscopeFaulty`` condition False, posts ``CollscopeReleased`` on the Node and frees the
node's place in the circuit breaker, whose held set is read from the nodes' marks.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from collscope.operator.clients import kube
from collscope.operator.controller import remediator
from collscope.operator.domain import ids, metrics, settings


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    unc = sub.add_parser(
        "uncordon",
        help="release a node collscope cordoned (only what collscope added)",
        description="Remove the cordon, the collscope.dev/faulty taint, the "
        "collscope.dev/quarantined label and the annotations collscope placed on NODE; marks "
        "that were there before collscope acted are left alone. The node's place in the "
        "circuit breaker is freed. Deleting the job or its Diagnosis never releases a node.",
    )
    unc.add_argument("node", metavar="NODE", help="the Node to release")
    _cluster_options(unc)
    unc.set_defaults(func=_cmd_uncordon)
    brk = sub.add_parser(
        "breaker",
        help="show or reset the cordon circuit breaker",
        description="The breaker caps cordons per time window and nodes held at once; once "
        "tripped it refuses every cordon until a human resets it.",
    )
    brk.add_argument(
        "action",
        choices=["show", "reset"],
        help="show: print the breaker's state; reset: close a tripped breaker (needs --by)",
    )
    brk.add_argument("--by", default="", help="who resets it (recorded; required for reset)")
    _cluster_options(brk)
    brk.set_defaults(func=_cmd_breaker)


def _cluster_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--namespace",
        default=settings.Settings().namespace,
        help="namespace of the operator and its breaker ConfigMap (default: %(default)s)",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG)")


def _remediator(args: argparse.Namespace) -> remediator.Remediator:
    defaults = settings.Settings()
    return remediator.Remediator(
        api=kube.Cluster.from_environment_cluster(args.kubeconfig),
        namespace=args.namespace,
        configmap=defaults.breaker_configmap,
        breaker_settings=defaults.breaker,
        defaults=defaults.remediation,
        meters=metrics.OperatorMetrics(),
    )


def _cmd_uncordon(args: argparse.Namespace) -> int:
    released = asyncio.run(_remediator(args).release(ids.NodeName(args.node)))
    print(f"{args.node}: {'released' if released else 'collscope holds nothing here'}")
    return 0


def _cmd_breaker(args: argparse.Namespace) -> int:
    rem = _remediator(args)
    if args.action == "reset":
        if not args.by:
            print("collscope breaker reset: --by NAME is required (it is recorded)")
            return 2
        summary = asyncio.run(rem.reset(args.by))
    else:
        summary = asyncio.run(rem.summary())
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0
