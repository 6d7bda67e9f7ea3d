#!/usr/bin/env bash
# GPU smoke test of libnccl-profiler-collscope.so with real NCCL (through PyTorch).
#
#   native/tests/gpu_smoke.sh            # needs >= 2 GPUs, PyTorch with NCCL
#   PYTHON=/path/to/python native/tests/gpu_smoke.sh
#
# Runs a 2-process torch.distributed NCCL program twice with NCCL_PROFILER_PLUGIN pointing at
# the plugin and COLLSCOPE_TRACE_DIR set:
#   1. default transports (intra-node: NVLink/PCIe P2P, no network proxy): completion records
#      must appear, timed by KernelCh events;
#   2. NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, which forces the NET transport between the two
#      local GPUs: ProxyOp/ProxyStep events must also fill flow slots.
# Then reads every ring file with collscope's reader (collscope.nodeagent.ring: needs numpy,
# which PyTorch brings) and checks what it finds. Exit 0 = passed, 77 = skipped
# (no GPUs / no PyTorch), anything else = failed. Record where it passed in native/README.md.
set -euo pipefail

native_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
repo_dir=$(cd "${native_dir}/.." && pwd)
python=${PYTHON:-${repo_dir}/.venv/bin/python}
if [[ ! -x ${python} ]]; then
    python=$(command -v python3 || true)
fi
if [[ -z ${python} ]]; then
    echo "gpu_smoke: no python found" >&2
    exit 77
fi

ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ ${ngpu} -lt 2 ]]; then
    echo "gpu_smoke: skipped: needs 2 GPUs (NCCL allows one rank per GPU), found ${ngpu}" >&2
    exit 77
fi
if ! "${python}" -c 'import numpy, torch, torch.distributed; assert torch.cuda.is_available()' 2>/dev/null; then
    echo "gpu_smoke: skipped: ${python} has no CUDA-enabled PyTorch" >&2
    exit 77
fi

make -C "${native_dir}" >/dev/null
lib="${native_dir}/build/libnccl-profiler-collscope.so"
work=$(mktemp -d /tmp/collscope-gpu-smoke-XXXXXX)
trap 'rm -rf "${work}"' EXIT

cat >"${work}/allreduce.py" <<'EOF'
import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
for numel in (256, 1 << 16, 1 << 24):  # 1 KiB .. 64 MiB of float32
    x = torch.ones(numel, device="cuda")
    for _ in range(5):
        dist.all_reduce(x)
torch.cuda.synchronize()
assert x[0].item() == dist.get_world_size() ** 5
if dist.get_rank() == 0:
    print("torch", torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))
dist.destroy_process_group()
EOF

cat >"${work}/check.py" <<'EOF'
"""Reads the smoke test's rings with collscope's own reader (collscope.nodeagent.ring)."""
import glob
import sys

from collscope.nodeagent import ring
from collscope.nodeagent.ring import eventlog, layout

trace_dir, need_flows = sys.argv[1], sys.argv[2] == "flows"
files = sorted(glob.glob(f"{trace_dir}/collscope-*.ring"))
if len(files) != 2:
    sys.exit(f"expected 2 ring files in {trace_dir}, found {files}")
for path in files:
    with ring.open(path) as r:
        ident, status, snap = r.identity, r.status(), r.snapshot()
        events, _, missed = r.events_since(r.first_cursor())
    ops = [e for e in events if isinstance(e, eventlog.OpEvent)]
    bad = [e for e in ops if e.end_ns < e.start_ns]
    if bad:
        sys.exit(f"{path}: record {bad[0].index} ends before it starts")
    kernel_timed = sum(1 for e in ops if e.flags & layout.OPF_KERNEL)
    flows_done = sum(1 for c in snap.comms for f in c.flows if f.total and f.done_consumed == f.total)
    print(f"{path}: rank {ident.rank}/{ident.world_size} local {ident.local_rank} "
          f"nccl '{ident.nccl_version}' api v{status.profiler_api}: {len(ops)} op records "
          f"({kernel_timed} with KernelCh), {flows_done} completed flows, "
          f"{status.events_dropped} dropped, {status.events_overwritten} overwritten, "
          f"{missed} missed")
    if len(ops) < 15:
        sys.exit(f"{path}: expected >= 15 all-reduce completion records, found {len(ops)}")
    if kernel_timed == 0:
        sys.exit(f"{path}: no record completed through KernelCh events")
    if need_flows and flows_done == 0:
        sys.exit(f"{path}: NET transport forced but no flow slot completed")
print("ok")
EOF

run() {
    local name=$1 need=$2
    shift 2
    local dir="${work}/${name}"
    mkdir -p "${dir}"
    echo "== ${name}"
    if ! env NCCL_PROFILER_PLUGIN="${lib}" COLLSCOPE_TRACE_DIR="${dir}" \
        NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV "$@" \
        "${python}" -m torch.distributed.run --standalone --nproc_per_node=2 \
        "${work}/allreduce.py" >"${work}/${name}.log" 2>&1; then
        tail -n 40 "${work}/${name}.log" >&2
        echo "gpu_smoke: ${name}: the torch.distributed program failed" >&2
        exit 1
    fi
    grep -E '^torch |[Pp]rofiler|collscope' "${work}/${name}.log" | sort -u | head -n 20 || true
    PYTHONPATH="${repo_dir}/nodeagent${PYTHONPATH:+:${PYTHONPATH}}" \
        "${python}" "${work}/check.py" "${dir}" "${need}"
}

run intranode kernel
run forced_net flows NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1
echo "gpu_smoke: passed"
