"""kopf handler: the mutating admission webhook injecting the plugin into opted-in pods
(docs/design.md, "Pod contract"; the patch itself is ``injection.patch``, pure and idempotent).

Registered only when the webhook is enabled (``COLLSCOPE_WEBHOOK_PORT``): kopf refuses to start
with admission handlers and no webhook server. The handler runs on pod CREATE only, for pods
whose annotations carry ``collscope.dev/diagnose`` (others are answered with no patch). The
chart's MutatingWebhookConfiguration (URL path ``/inject``) sends only those pods (a CEL
``matchCondition`` on the annotation) and has ``failurePolicy: Ignore``, as has a managed
configuration (``ignore_failures``): training must start even when the operator is down.

Admission that cannot hurt (issue 15 item 6): kopf answers ``allowed: false`` when a mutating
handler raises, so this handler never lets an exception out. Whatever goes wrong computing or
checking the patch (a pod shaped in a way the patch does not expect, a bug), the pod is admitted
unchanged, the error is logged with its traceback and returned as an admission warning (shown
to whoever created the pod: ``kubectl`` prints it, a controller logs it). The Warning Event is
posted by the operator's pod watcher (``handlers.opted_in_pod``: ``NotInjected``) once the pod
exists, since at admission it has no name or uid yet to hang an Event on. A pod whose own
profiler plugin is chained behind collscope's (``injection.displaced``) gets a warning here too,
and a ``ProfilerPluginChained`` Warning Event from the watcher.

kopf turns the ``patch`` kwarg into the JSONPatch of the answer by diffing the pod before and
after its transformation functions; the RFC 6902 ops of ``injection.patch`` are applied there,
after being applied once here to a copy so that kopf's own application cannot fail.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

import jsonpatch
import kopf

from collscope.operator.domain import injection, owners, patches

HANDLER_ID = "inject"
# The admission warning for a failed injection; the pod is admitted without collscope.
FAILED = "collscope: injection failed, pod admitted unchanged (no diagnosis for it)"
WARNING_MAX = 256  # characters: the API server may truncate longer admission warnings

Plan = Callable[[Mapping[str, Any], injection.InjectionSettings], list[patches.Op]]


def answer(
    body: Mapping[str, Any],
    config: injection.InjectionSettings,
    logger: logging.Logger | logging.LoggerAdapter[Any],
    plan: Plan = injection.patch,
) -> tuple[list[patches.Op], list[str]]:
    """The ops to apply and the admission warnings; ([], [reason]) when anything fails."""
    try:
        ops = plan(body, config)
        if ops:  # applied once to a copy: kopf applying them again cannot raise
            jsonpatch.apply_patch(copy.deepcopy(dict(body)), ops)
        warnings = [f"collscope: {d.describe()}" for d in injection.displaced(body, config)]
    except Exception as e:  # anything: a handler that raises would deny the pod
        meta = body.get("metadata")
        meta = meta if isinstance(meta, Mapping) else {}
        name = meta.get("name") or f"{meta.get('generateName', '')}*"
        logger.exception("injection into pod %s failed; admitting it unchanged", name)
        # Kubernetes may truncate a warning past 256 characters; keep the cause readable.
        return [], [f"{FAILED}: {type(e).__name__}: {e}"[:WARNING_MAX]]
    for w in warnings:
        logger.warning("%s", w)
    return ops, warnings


def register(
    registry: kopf.OperatorRegistry,
    config: injection.InjectionSettings,
    plan: Plan = injection.patch,
) -> None:
    """Attach the webhook handler; ``plan`` computes the patch (tests make it raise)."""

    def inject(
        body: kopf.Body,
        patch: kopf.Patch,
        warnings: list[str],
        logger: logging.Logger | logging.LoggerAdapter[Any],
        **_: Any,
    ) -> None:
        ops, notes = answer(body, config, logger, plan)
        warnings.extend(notes)
        if ops:
            patch.fns.append(lambda pod: jsonpatch.apply_patch(pod, ops, in_place=True))

    kopf.on.mutate(
        "v1", "pods", id=HANDLER_ID, operations={"CREATE"}, ignore_failures=True,
        annotations={owners.OPT_IN_ANNOTATION: kopf.PRESENT}, registry=registry,
    )(inject)  # fmt: skip
