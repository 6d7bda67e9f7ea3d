"""Admission that cannot hurt (issue 15 item 6): what the webhook adds to a pod keeps it
admissible in a namespace enforcing the Pod Security Standards' *restricted* profile, and no pod,
however shaped, makes the webhook's handler raise (a raising kopf handler denies the pod).

The profile's rules are written down here from the Kubernetes documentation (Concepts ->
Security -> Pod Security Standards, https://kubernetes.io/docs/concepts/security/
pod-security-standards/, policy version "latest" as of 1.28-1.33), for the fields a pod spec can
carry; ``violations`` names each one broken. Restricted includes every Baseline control.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import jsonpatch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collscope.operator.controller import webhook
from collscope.operator.domain import injection

CONFIG = injection.InjectionSettings(image="registry.local/collscope:test")
OPT_IN = {"collscope.dev/diagnose": "true"}

# Baseline "Capabilities": adding any other capability is forbidden.
BASELINE_CAPS = frozenset(
    {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
     "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
)  # fmt: skip
# Restricted "Volume Types": only these volume sources.
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
     "projected", "secret"}
)  # fmt: skip
# Baseline "SELinux": the type may be unset or one of these; user and role must be unset.
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t",
                           "container_engine_t"})  # fmt: skip
# Baseline "Sysctls": only the safe set.
SAFE_SYSCTLS = frozenset(
    {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
     "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
     "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
     "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
     "net.ipv4.tcp_keepalive_probes"}
)  # fmt: skip


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field) or ():
            yield f"{field}[{c.get('name')}]", c


def violations(pod: Mapping[str, Any]) -> list[str]:
    """Every restricted-profile rule ``pod`` breaks, as "where: rule"."""
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    out: list[str] = []
    # Baseline: host namespaces, HostProcess, hostPath, host ports, privileged, capabilities,
    # /proc mount, seccomp not Unconfined, SELinux, AppArmor, sysctls.
    for ns in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(ns):
            out.append(f"pod: {ns} must be unset or false")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        out.append("pod: windowsOptions.hostProcess must not be true")
    for s in psc.get("sysctls") or ():
        if s.get("name") not in SAFE_SYSCTLS:
            out.append(f"pod: sysctl {s.get('name')} is not in the safe set")
    for v in spec.get("volumes") or ():
        kinds = set(v) - {"name"}
        if "hostPath" in kinds:
            out.append(f"volume {v['name']}: hostPath is forbidden")
        if not kinds <= RESTRICTED_VOLUMES:
            out.append(f"volume {v['name']}: type {sorted(kinds)} not allowed")

    def seccomp_of(sc: Mapping[str, Any]) -> str | None:
        return (sc.get("seccompProfile") or {}).get("type")

    def selinux_ok(sc: Mapping[str, Any]) -> bool:
        o = sc.get("seLinuxOptions") or {}
        return o.get("type", "") in SELINUX_TYPES and not o.get("user") and not o.get("role")

    if not selinux_ok(psc):
        out.append("pod: seLinuxOptions type/user/role not allowed")
    if seccomp_of(psc) == "Unconfined":
        out.append("pod: seccompProfile Unconfined")
    for where, c in _containers(spec):
        sc = c.get("securityContext") or {}
        caps = sc.get("capabilities") or {}
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: windowsOptions.hostProcess")
        for p in c.get("ports") or ():
            if p.get("hostPort"):
                out.append(f"{where}: hostPort {p['hostPort']}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}: procMount must be Default")
        if not selinux_ok(sc):
            out.append(f"{where}: seLinuxOptions type/user/role not allowed")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor not in (None, "RuntimeDefault", "Localhost"):
            out.append(f"{where}: appArmorProfile {apparmor}")
        # Restricted on top of Baseline.
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if sc.get("runAsNonRoot") is False or non_root is not True:
            out.append(f"{where}: runAsNonRoot must be true (container or pod)")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.append(f"{where}: runAsUser must not be 0")
        if (seccomp_of(sc) or seccomp_of(psc)) not in ("RuntimeDefault", "Localhost"):
            out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost")
        if "ALL" not in (caps.get("drop") or ()):
            out.append(f"{where}: capabilities must drop ALL")
        added = set(caps.get("add") or ())
        if added - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: may add only NET_BIND_SERVICE, adds {sorted(added)}")
        if added - BASELINE_CAPS:
            out.append(f"{where}: adds capabilities outside the baseline set")
    return out


def restricted_container(name: str) -> dict[str, Any]:
    return {
        "name": name, "image": "pytorch:2",
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True,
                            "runAsUser": 1000, "capabilities": {"drop": ["ALL"]},
                            "seccompProfile": {"type": "RuntimeDefault"}},
    }  # fmt: skip


def inject(pod: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(pod), injection.patch(pod, CONFIG))
    return out


def test_the_rules_catch_what_they_should() -> None:
    """The checker is not vacuous: the init container as it was before issue 15 breaks three
    rules, a privileged hostPath pod many."""
    old = {"spec": {"initContainers": [{"name": "collscope-plugin", "image": "x", "securityContext":
           {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True}}]}}  # fmt: skip
    assert [v.split(": ", 1)[1].split(" ")[0] for v in violations(old)] == [
        "runAsNonRoot", "seccompProfile", "capabilities"
    ]  # fmt: skip
    bad = {"spec": {"hostPID": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
                    "containers": [{"name": "a", "securityContext": {
                        "privileged": True, "runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]},
                        "seccompProfile": {"type": "Unconfined"}}}]}}  # fmt: skip
    assert len(violations(bad)) >= 8
    assert violations({"spec": {"containers": [restricted_container("t")]}}) == []


@pytest.mark.parametrize("pod_level", [False, True])
def test_injected_pod_stays_restricted(pod_level: bool) -> None:
    """A pod a restricted namespace admits is still admitted after injection: with the
    settings on each container, or on the pod (then the containers say less)."""
    trainer = restricted_container("trainer")
    spec: dict[str, Any] = {"containers": [trainer]}
    if pod_level:
        sc = trainer["securityContext"]
        spec["securityContext"] = {"runAsNonRoot": sc.pop("runAsNonRoot"),
                                   "seccompProfile": sc.pop("seccompProfile")}  # fmt: skip
    pod = {"metadata": {"name": "p", "annotations": OPT_IN}, "spec": spec}
    assert violations(pod) == []
    out = inject(pod)
    assert [c["name"] for c in out["spec"]["initContainers"]] == [injection.INIT_CONTAINER]
    assert violations(out) == []
    # The init container is compliant on its own, whatever the pod level says.
    (init,) = out["spec"]["initContainers"]
    assert violations({"spec": {"initContainers": [init]}}) == []
    assert init["securityContext"]["runAsUser"] != 0


# Pods shaped as no API server would send them: the handler must answer, never raise.
junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8,
)  # fmt: skip
field = st.sampled_from(["spec", "containers", "env", "volumes", "initContainers",
                         "volumeMounts", "name", "value"])  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    containers=st.one_of(junk, st.lists(st.dictionaries(field, junk, max_size=4), max_size=3)),
    volumes=junk,
    inits=junk,
)
def test_no_pod_makes_the_handler_raise(containers: Any, volumes: Any, inits: Any) -> None:
    pod = {
        "metadata": {"generateName": "x-", "annotations": OPT_IN},
        "spec": {"containers": containers, "volumes": volumes, "initContainers": inits},
    }
    log = logging.getLogger("hostile.admission")
    log.disabled = True  # tracebacks of expected failures would flood the output
    try:
        ops, warnings = webhook.answer(pod, CONFIG, log)
    finally:
        log.disabled = False
    if ops:  # what is answered applies to the pod as sent
        jsonpatch.apply_patch(copy.deepcopy(pod), ops)
    else:
        assert all(w.startswith(("collscope:",)) for w in warnings)
