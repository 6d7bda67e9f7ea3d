"""A training process's global rank from its environment, whatever launched it (issue 15 item 7).

The plugin writes ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` into its ring header; a process started
by ``mpirun``, ``srun`` or a PMIx launcher has none of them, and its ring would carry rank -1.
``resolve`` reads the launchers' own variables, first found wins:

1. a global rank: ``RANK`` (torchrun, Kubeflow PyTorchJob), ``OMPI_COMM_WORLD_RANK`` (Open MPI),
   ``PMI_RANK`` (MPICH, Intel MPI, Hydra), ``PMIX_RANK`` (PMIx launchers: prrte, Slurm with
   ``--mpi=pmix``), ``SLURM_PROCID`` (``srun``);
2. else the pod's index in an Indexed Job (``JOB_COMPLETION_INDEX``, also set in the pods of a
   JobSet's Jobs) combined with the process's local rank: ``index * per_node + local_rank``,
   where the local rank is ``LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_RANK``, ``MPI_LOCALRANKID``
   or ``SLURM_LOCALID`` and the processes per pod ``LOCAL_WORLD_SIZE``,
   ``OMPI_COMM_WORLD_LOCAL_SIZE``, ``MPI_LOCALNRANKS`` or ``PET_NPROC_PER_NODE``. An index with
   neither a local rank nor a per-pod count is one process per pod: the rank is the index. A
   local rank without the count cannot be placed, and is unknown. (A JobSet of several Jobs
   numbers pods per Job: its ranks need one of the variables of 1.)
3. else unknown, with the reason naming what was looked for, so the ring is listed as such
   rather than silently dropped.

Values must be decimal integers >= 0 (the plugin's own rule, ``native/src/ring.c`` ``env_int``);
a malformed one is skipped like an unset one and named in the reason. The world size comes from
``WORLD_SIZE``, ``OMPI_COMM_WORLD_SIZE``, ``PMI_SIZE`` or ``SLURM_NTASKS``. The environment is
the writer's own, read by the agent from ``/proc/<pid>/environ``; its values are the tenant's,
as the ring header's are.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

RANK_VARS: Final = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")
INDEX_VARS: Final = ("JOB_COMPLETION_INDEX",)
LOCAL_RANK_VARS: Final = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                          "SLURM_LOCALID")  # fmt: skip
PER_POD_VARS: Final = ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                       "PET_NPROC_PER_NODE")  # fmt: skip
WORLD_VARS: Final = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
INT32_MAX: Final = 2**31 - 1  # the header's rank field is an int32


@dataclass(frozen=True)
class Resolved:
    """A rank and where it came from, or None with the reason it is unknown."""

    rank: int | None
    source: str  # "RANK", "JOB_COMPLETION_INDEX*LOCAL_WORLD_SIZE+LOCAL_RANK", ... or ""
    reason: str = ""
    local_rank: int | None = None
    world_size: int | None = None


def _int(value: str | None) -> int | None:
    if value is None or not value.isascii() or not value.isdigit():
        return None
    n = int(value)
    return n if n <= INT32_MAX else None


def _first(env: Mapping[str, str], names: tuple[str, ...], bad: list[str]) -> tuple[str, int]:
    for name in names:
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        n = _int(raw)
        if n is None:
            bad.append(f"{name}={raw[:20]!r}")
            continue
        return name, n
    return "", -1


def resolve(env: Mapping[str, str]) -> Resolved:
    """The global rank of a process with environment ``env`` (see the module docstring)."""
    bad: list[str] = []
    local_name, local = _first(env, LOCAL_RANK_VARS, bad)
    world_name, world = _first(env, WORLD_VARS, bad)
    local_rank = local if local_name else None
    world_size = world if world_name else None
    name, rank = _first(env, RANK_VARS, bad)
    if name:
        return Resolved(rank, name, "", local_rank, world_size)
    index_name, index = _first(env, INDEX_VARS, bad)
    per_name, per = _first(env, PER_POD_VARS, bad)
    if index_name and not local_name and not per_name:
        return Resolved(index, f"{index_name} (one process per pod)", "", local_rank, world_size)
    if index_name and local_name and per_name and per > 0 and local < per:
        total = index * per + local
        if total <= INT32_MAX:
            how = f"{index_name}*{per_name}+{local_name}"
            return Resolved(total, how, "", local_rank, world_size)
    if index_name and local_name and not per_name:
        why = f"{index_name} and {local_name} set, processes per pod unknown"
    elif index_name and per_name and not local_name:
        why = f"{index_name} and {per_name} set, local rank unknown"
    elif index_name:
        why = f"{local_name}={local} out of range for {per_name}={per}"
    else:
        why = f"none of {', '.join(RANK_VARS + INDEX_VARS)} set"
    if bad:
        why += f"; malformed: {', '.join(bad)}"
    return Resolved(None, "", f"rank unknown: {why}", local_rank, world_size)


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ`` (``KEY=value`` entries separated by NUL) as a dict. A name given
    twice keeps its first value, the one glibc's ``getenv`` (hence the plugin) returns."""
    out: dict[str, str] = {}
    for entry in raw.decode(errors="replace").split("\0"):
        key, sep, value = entry.partition("=")
        if sep and key and key not in out:
            out[key] = value
    return out
