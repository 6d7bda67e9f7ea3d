"""kopf handler: the mutating admission webhook injecting the plugin into opted-in pods
(DESIGN.md §1; the patch itself is ``injection.patch``, pure and idempotent).

Registered only when the webhook is enabled (``COLLSCOPE_WEBHOOK_PORT``): kopf refuses to start
with admission handlers and no webhook server. The handler runs on pod CREATE only, for pods
whose annotations carry ``collscope.dev/diagnose`` (others are answered with no patch), and is
declared ``ignore_failures`` so a managed configuration gets ``failurePolicy: Ignore``: training
must start even when the operator is down. The chart's own MutatingWebhookConfiguration (URL
path ``/inject``) sets the same policy and an ``objectSelector``-free rule on pods.

kopf turns the ``patch`` kwarg into the JSONPatch of the answer by diffing the pod before and
after its transformation functions; the RFC 6902 ops of ``injection.patch`` are applied there.
"""

from __future__ import annotations

from typing import Any

import jsonpatch
import kopf

from collscope.operator import injection, owners

HANDLER_ID = "inject"


def register(registry: kopf.OperatorRegistry, config: injection.InjectionSettings) -> None:
    def inject(body: kopf.Body, patch: kopf.Patch, **_: Any) -> None:
        ops = injection.patch(body, config)
        if ops:
            patch.fns.append(lambda pod: jsonpatch.apply_patch(pod, ops, in_place=True))

    kopf.on.mutate(
        "v1", "pods", id=HANDLER_ID, operations={"CREATE"}, ignore_failures=True,
        annotations={owners.OPT_IN_ANNOTATION: kopf.PRESENT}, registry=registry,
    )(inject)  # fmt: skip
