"""The one-box layout and how it finds the plugin (processes: tests/e2e)."""

from __future__ import annotations

import pathlib
import socket

import pytest

from collscope.operator import errors
from collscope.operator.onebox import box, nccl


def test_layout_places_ranks_node_by_node() -> None:
    lay = box.Layout(nodes=3, ranks_per_node=2, job="j")
    assert lay.world == 6
    assert [lay.node_of(r) for r in range(6)] == ["node-0"] * 2 + ["node-1"] * 2 + ["node-2"] * 2
    assert lay.ranks_by_node() == {"node-0": [0, 1], "node-1": [2, 3], "node-2": [4, 5]}
    assert lay.pod_of(4) == "j-4"
    # every node on its own loopback address, as DaemonSet pods are on their nodes' IPs
    assert [lay.address_of(n) for n in lay.node_names()] == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]


def test_explicit_plugin_path_must_exist(tmp_path: pathlib.Path) -> None:
    missing = tmp_path / "nope.so"
    with pytest.raises(errors.PluginError, match=f"COLLSCOPE_PLUGIN={missing}: no such file"):
        box.find_plugin(str(missing))
    real = tmp_path / nccl.LIB_NAME
    real.write_bytes(b"\x7fELF")
    assert box.find_plugin(str(real)) == real


def test_plugin_from_environment(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = tmp_path / nccl.LIB_NAME
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setenv("COLLSCOPE_PLUGIN", str(lib))
    assert box.find_plugin() == lib


def test_plugin_of_this_checkout_or_how_to_build_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLLSCOPE_PLUGIN", raising=False)
    try:
        found = box.find_plugin()
    except errors.PluginError as e:
        assert "make -C" in str(e) and "native" in str(e)
    else:
        assert found.name == nccl.LIB_NAME and found.parent.name == "build"


def test_free_port_is_free_on_every_address() -> None:
    hosts = ["127.0.0.2", "127.0.0.3"]
    port = box.free_port(hosts)
    for h in hosts:
        with socket.socket() as s:
            s.bind((h, port))
