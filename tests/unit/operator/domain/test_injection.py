"""The webhook's patch: what an opted-in pod gets, that the user's settings win, that a second
pass changes nothing, and that other pods are untouched."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import given
from hypothesis import strategies as st

from collscope.operator.domain import injection

SETTINGS = injection.InjectionSettings(image="registry.local/collscope:test", ring_bytes=1 << 22)
OPT_IN = {"collscope.dev/diagnose": "true"}


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": [{"name": "trainer", "image": "pytorch"}]}
    body.update(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "llama-0", "annotations": annotations or {}},
        "spec": body,
    }


def inject(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = jsonpatch.apply_patch(obj, injection.patch(obj, SETTINGS))
    return out


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_opted_in_pod_gets_everything() -> None:
    out = inject(pod(OPT_IN))
    vols = {v["name"]: v for v in out["spec"]["volumes"]}
    assert vols["collscope-plugin"] == {"name": "collscope-plugin", "emptyDir": {}}
    assert vols["collscope-trace"]["emptyDir"]["medium"] == "Memory"
    (init,) = out["spec"]["initContainers"]
    assert init["image"] == "registry.local/collscope:test"
    assert init["command"] == ["cp", "-R", "/opt/collscope/lib/libnccl-profiler-collscope.so",
                               "/opt/collscope/probe", "/opt/collscope-plugin/"]  # fmt: skip
    (c,) = out["spec"]["containers"]
    env = env_of(c)
    assert env["NCCL_PROFILER_PLUGIN"] == "/opt/collscope-plugin/libnccl-profiler-collscope.so"
    assert env["COLLSCOPE_TRACE_DIR"] == "/run/collscope"
    assert env["COLLSCOPE_RING_BYTES"] == str(1 << 22)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["collscope-plugin"]["readOnly"] is True
    assert mounts["collscope-trace"]["mountPath"] == "/run/collscope"


def test_other_pods_are_untouched() -> None:
    assert injection.patch(pod(), SETTINGS) == []
    assert injection.patch(pod({"collscope.dev/diagnose": "false"}), SETTINGS) == []
    assert injection.patch({"metadata": {}}, SETTINGS) == []


def test_idempotent() -> None:
    once = inject(pod(OPT_IN))
    assert injection.patch(once, SETTINGS) == []
    assert inject(copy.deepcopy(once)) == once


def test_existing_env_volumes_and_mounts_win() -> None:
    user = pod(
        OPT_IN,
        volumes=[{"name": "data", "emptyDir": {}}],
        initContainers=[{"name": "warmup", "image": "busybox"}],
        containers=[
            {
                "name": "trainer",
                "image": "pytorch",
                "env": [{"name": "NCCL_PROFILER_PLUGIN", "value": "mine.so"}],
                "volumeMounts": [{"name": "data", "mountPath": "/run/collscope"}],
            },
            {"name": "sidecar", "image": "x"},
        ],
    )
    out = inject(user)
    assert [v["name"] for v in out["spec"]["volumes"]] == [
        "data",
        "collscope-plugin",
        "collscope-trace",
    ]
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["warmup", "collscope-plugin"]
    trainer, sidecar = out["spec"]["containers"]
    # The user's own plugin is not kept silently: ours loads and forwards to it.
    assert env_of(trainer)["NCCL_PROFILER_PLUGIN"] == SETTINGS.plugin_path
    assert env_of(trainer)["COLLSCOPE_NEXT_PROFILER_PLUGIN"] == "mine.so"
    assert [e["name"] for e in trainer["env"]].count("NCCL_PROFILER_PLUGIN") == 1
    assert "COLLSCOPE_TRACE_DIR" in env_of(trainer)
    # /run/collscope is the user's: our trace volume is not mounted over it.
    paths = {m["mountPath"]: m["name"] for m in trainer["volumeMounts"]}
    assert paths["/run/collscope"] == "data" and "collscope-trace" not in paths.values()
    assert "NCCL_PROFILER_PLUGIN" in env_of(sidecar)
    assert injection.patch(out, SETTINGS) == []


def test_patch_only_appends_to_existing_lists() -> None:
    user = pod(OPT_IN, volumes=[{"name": "data", "emptyDir": {}}])
    ops = injection.patch(user, SETTINGS)
    assert {
        "op": "add",
        "path": "/spec/volumes/-",
        "value": {"name": "collscope-plugin", "emptyDir": {}},
    } in ops
    assert all(op["op"] == "add" for op in ops)


def test_a_pods_own_profiler_plugin_is_chained_behind_ours() -> None:
    """NCCL loads one profiler plugin: a container's own (NCCL Inspector, a vendor plugin) is
    replaced by collscope's and handed over in COLLSCOPE_NEXT_PROFILER_PLUGIN, verbatim
    (``valueFrom`` too), and listed for the webhook's warning."""
    from_cm = {"configMapKeyRef": {"name": "nccl", "key": "plugin"}}
    user = pod(
        OPT_IN,
        containers=[
            {"name": "inspector", "image": "x",
             "env": [{"name": "NCCL_PROFILER_PLUGIN", "value": "libnccl-profiler-inspector.so"},
                     {"name": "RANK", "value": "3"}]},
            {"name": "vendor", "image": "x",
             "env": [{"name": "NCCL_PROFILER_PLUGIN", "valueFrom": from_cm}]},
            {"name": "plain", "image": "x"},
        ],
    )  # fmt: skip
    gone = injection.displaced(user, SETTINGS)
    assert [(d.container, dict(d.entry)) for d in gone] == [
        ("inspector", {"value": "libnccl-profiler-inspector.so"}),
        ("vendor", {"valueFrom": from_cm}),
    ]
    assert "libnccl-profiler-inspector.so" in gone[0].describe()
    out = inject(user)
    inspector, vendor, plain = (env_of(c) for c in out["spec"]["containers"])
    for env in (inspector, vendor, plain):
        assert env["NCCL_PROFILER_PLUGIN"] == SETTINGS.plugin_path
    assert inspector["COLLSCOPE_NEXT_PROFILER_PLUGIN"] == "libnccl-profiler-inspector.so"
    assert inspector["RANK"] == "3"
    assert vendor["COLLSCOPE_NEXT_PROFILER_PLUGIN"] == from_cm
    assert "COLLSCOPE_NEXT_PROFILER_PLUGIN" not in plain
    assert injection.forwarded(out) == ["inspector", "vendor"]
    # Done once: nothing more to chain or to warn about.
    assert injection.patch(out, SETTINGS) == [] and injection.displaced(out, SETTINGS) == []


def test_a_chain_the_user_arranged_is_left_alone() -> None:
    env = [{"name": "NCCL_PROFILER_PLUGIN", "value": "mine.so"},
           {"name": "COLLSCOPE_NEXT_PROFILER_PLUGIN", "value": "other.so"}]  # fmt: skip
    user = pod(OPT_IN, containers=[{"name": "t", "image": "x", "env": env}])
    assert injection.displaced(user, SETTINGS) == []
    (c,) = inject(user)["spec"]["containers"]
    assert env_of(c)["NCCL_PROFILER_PLUGIN"] == "mine.so"
    assert env_of(c)["COLLSCOPE_NEXT_PROFILER_PLUGIN"] == "other.so"
    assert not injection.displaced(pod(), SETTINGS) and not injection.forwarded(pod())


def test_flight_recorder_env_makes_a_dump_possible() -> None:
    env = env_of(inject(pod(OPT_IN))["spec"]["containers"][0])
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/run/collscope/fr_pipe_rank_"
    # The dump goes where torch puts it by default, where the agent looks, not to the tmpfs.
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env


def test_flight_recorder_env_never_overrides_the_pods_own() -> None:
    own = [
        {"name": "TORCH_FR_BUFFER_SIZE", "value": "0"},
        {"name": "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "value": "/data/pipe_"},
    ]
    newer = [{"name": "TORCH_NCCL_TRACE_BUFFER_SIZE", "value": "100"}]
    out = inject(
        pod(
            OPT_IN,
            containers=[
                {"name": "a", "image": "x", "env": own},
                {"name": "b", "image": "x", "env": newer},
            ],
        )
    )
    a, b = (env_of(c) for c in out["spec"]["containers"])
    assert a["TORCH_FR_BUFFER_SIZE"] == "0" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in a
    assert a["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/data/pipe_"
    assert b["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "100"
    assert b["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "/run/collscope/fr_pipe_rank_"


def test_no_pipe_where_the_ring_volume_is_not_at_the_trace_dir() -> None:
    # torch fails to start a process group whose pipe it cannot create.
    elsewhere = [{"name": "collscope-trace", "mountPath": "/elsewhere"}]
    other = [{"name": "data", "mountPath": "/run/collscope"}]
    out = inject(
        pod(
            OPT_IN,
            containers=[
                {"name": "a", "image": "x", "volumeMounts": elsewhere},
                {"name": "b", "image": "x", "volumeMounts": other},
            ],
        )
    )
    for c in out["spec"]["containers"]:
        assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" not in env_of(c)
        assert env_of(c)["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000"


def test_flight_recorder_env_opt_out() -> None:
    off = {**OPT_IN, "collscope.dev/flight-recorder": "false"}
    env = env_of(inject(pod(off))["spec"]["containers"][0])
    assert "NCCL_PROFILER_PLUGIN" in env  # the rest of the injection stays
    assert not {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"} & set(env)


names = st.sampled_from(
    ["NCCL_PROFILER_PLUGIN", "POD_NAME", "FOO", "COLLSCOPE_TRACE_DIR", "TORCH_FR_BUFFER_SIZE",
     "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]
)  # fmt: skip
container = st.fixed_dictionaries(
    {"name": st.sampled_from(["a", "b", "c"]), "image": st.just("i")},
    optional={
        "env": st.lists(st.builds(lambda n: {"name": n, "value": "u"}, names), max_size=3),
        "volumeMounts": st.lists(
            st.builds(
                lambda n, p: {"name": n, "mountPath": p},
                st.sampled_from(["collscope-trace", "data"]),
                st.sampled_from(["/run/collscope", "/data", "/opt/collscope-plugin"]),
            ),
            max_size=2,
        ),
    },
)


@given(
    containers=st.lists(container, min_size=1, max_size=3),
    volumes=st.one_of(st.none(), st.lists(st.builds(lambda n: {"name": n, "emptyDir": {}},
                                                    st.sampled_from(["data", "collscope-plugin"])),
                                         max_size=2)),
    opted=st.booleans(),
)  # fmt: skip
def test_any_pod_injected_twice_equals_once(
    containers: list[dict[str, Any]], volumes: list[dict[str, Any]] | None, opted: bool
) -> None:
    spec: dict[str, Any] = {"containers": containers}
    if volumes is not None:
        spec["volumes"] = volumes
    before = {"metadata": {"annotations": OPT_IN if opted else {}}, "spec": spec}
    once = inject(copy.deepcopy(before))
    assert injection.patch(once, SETTINGS) == []
    if not opted:
        assert once == before
    for c_before, c_after in zip(
        before["spec"]["containers"], once["spec"]["containers"], strict=True
    ):
        before_env, after_env = env_of(c_before), env_of(c_after)
        for name, value in before_env.items():  # every user env value survives
            chained = opted and name == "NCCL_PROFILER_PLUGIN" and value != SETTINGS.plugin_path
            # A plugin of the user's own is chained behind ours.
            assert after_env["COLLSCOPE_NEXT_PROFILER_PLUGIN" if chained else name] == value
