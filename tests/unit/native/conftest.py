"""Builds the plugin once per session and drives it through ctypes the way NCCL does.

``make -C native BUILD=<tmp>`` builds ``libnccl-profiler-collscope.so`` into a temporary
directory (never into the source tree); each test loads its own copy of it, so that every test
gets a fresh plugin (its process-wide state: one ring file per loaded copy) in one process.

``Nccl`` (``collscope.operator.onebox.nccl``) mirrors the profiler ABI of
shared/notes/nccl-profiler.md §2 in ctypes; see that module.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

from collscope.operator.onebox import nccl as abi

NATIVE = pathlib.Path(__file__).resolve().parents[3] / "native"

# NCCL's side of the ABI lives in the package (the one-box data path drives the plugin with it
# too); its names are re-exported for the tests here and in tests/unit/nodeagent.
GROUP = abi.GROUP
COLL = abi.COLL
P2P = abi.P2P
PROXY_OP = abi.PROXY_OP
PROXY_STEP = abi.PROXY_STEP
KERNEL_CH = abi.KERNEL_CH
GROUP_API = abi.GROUP_API
COLL_API = abi.COLL_API
P2P_API = abi.P2P_API
KERNEL_LAUNCH = abi.KERNEL_LAUNCH
SEND_GPU_WAIT = abi.SEND_GPU_WAIT
SEND_WAIT = abi.SEND_WAIT
RECV_WAIT = abi.RECV_WAIT
RECV_FLUSH_WAIT = abi.RECV_FLUSH_WAIT
RECV_GPU_WAIT = abi.RECV_GPU_WAIT
PROXY_OP_IN_PROGRESS = abi.PROXY_OP_IN_PROGRESS
SEND_PEER_WAIT = abi.SEND_PEER_WAIT
KERNEL_CH_STOP = abi.KERNEL_CH_STOP
GROUP_START_API_STOP = abi.GROUP_START_API_STOP
GROUP_END_API_START = abi.GROUP_END_API_START
Nccl = abi.Nccl
SEND_STATES = abi.SEND_STATES
RECV_STATES = abi.RECV_STATES
LIB_NAME = abi.LIB_NAME


@pytest.fixture(scope="session")
def plugin_build(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """``make -C native`` into a temporary BUILD directory, once per session."""
    make = shutil.which("make")
    cc = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")
    if make is None or cc is None:
        pytest.skip("make and a C compiler (gcc) are needed to build the plugin (make -C native)")
    build = tmp_path_factory.mktemp("native-build")
    res = subprocess.run(
        [make, "-C", str(NATIVE), f"BUILD={build}"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert res.returncode == 0, f"make -C native failed:\n{res.stdout}\n{res.stderr}"
    lib = build / LIB_NAME
    assert lib.is_file(), res.stdout
    return lib


@pytest.fixture
def trace_dir(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    """COLLSCOPE_TRACE_DIR and the identity environment a training pod gives the plugin."""
    out = tmp_path / "trace"
    out.mkdir()
    for name, value in {
        "COLLSCOPE_TRACE_DIR": str(out),
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "POD_NAME": "llama-5",
        "POD_NAMESPACE": "train",
        "NODE_NAME": "gpu-node-2",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("COLLSCOPE_RING_BYTES", raising=False)
    return out


@pytest.fixture
def load(
    plugin_build: pathlib.Path, tmp_path: pathlib.Path, trace_dir: pathlib.Path
) -> Iterator[Callable[[int], Nccl]]:
    """``load(api)``: a fresh copy of the plugin (its own process-wide state and ring)."""
    loaded: list[Nccl] = []

    def make(api: int) -> Nccl:
        path = tmp_path / f"copy{len(loaded)}" / LIB_NAME
        path.parent.mkdir()
        shutil.copy(plugin_build, path)
        loaded.append(Nccl(path, api))
        return loaded[-1]

    yield make
    # like commFree: finalize what a test left open, which also stops the heartbeat thread
    for nccl in loaded:
        for ctx in list(nccl.contexts):
            nccl.finalize(ctx)
