"""Every launcher's rank variables, their precedence, the Indexed Job fallback, and the reason
given when a rank cannot be known (``launchers.resolve``)."""

from __future__ import annotations

import pytest

from collscope.nodeagent import launchers


@pytest.mark.parametrize(
    ("env", "rank", "source"),
    [
        ({"RANK": "5"}, 5, "RANK"),  # torchrun, PyTorchJob
        ({"OMPI_COMM_WORLD_RANK": "6"}, 6, "OMPI_COMM_WORLD_RANK"),  # Open MPI mpirun
        ({"PMI_RANK": "7"}, 7, "PMI_RANK"),  # MPICH / Intel MPI (Hydra)
        ({"PMIX_RANK": "8"}, 8, "PMIX_RANK"),  # PMIx (prrte, srun --mpi=pmix)
        ({"SLURM_PROCID": "9"}, 9, "SLURM_PROCID"),  # srun
    ],
)
def test_each_launcher(env: dict[str, str], rank: int, source: str) -> None:
    got = launchers.resolve(env)
    assert (got.rank, got.source, got.reason) == (rank, source, "")


def test_precedence_is_the_documented_order() -> None:
    names = launchers.RANK_VARS
    for i, name in enumerate(names):
        env = {n: str(10 + j) for j, n in enumerate(names[i:], start=i)}
        env["JOB_COMPLETION_INDEX"] = "3"
        assert launchers.resolve(env).source == name
        assert launchers.resolve(env).rank == 10 + i
    # srun under mpirun-less PMIx: PMIX_RANK and SLURM_PROCID agree; RANK set by the user wins.
    assert launchers.resolve({"SLURM_PROCID": "3", "RANK": "0"}).rank == 0


def test_a_malformed_variable_is_skipped_and_named() -> None:
    got = launchers.resolve({"RANK": "-1", "PMI_RANK": "4"})
    assert (got.rank, got.source) == (4, "PMI_RANK")
    bad = launchers.resolve({"RANK": "1e3", "OMPI_COMM_WORLD_RANK": "x"})
    assert bad.rank is None
    assert "RANK='1e3'" in bad.reason and "OMPI_COMM_WORLD_RANK='x'" in bad.reason
    assert launchers.resolve({"RANK": str(2**31)}).rank is None  # beyond the int32 field
    assert launchers.resolve({"RANK": "٣"}).rank is None  # a digit, but not ASCII


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        # Indexed Job, torchrun-less: pod index times processes per pod plus local rank.
        ({"JOB_COMPLETION_INDEX": "2", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "4"}, 11),
        (
            {
                "JOB_COMPLETION_INDEX": "1",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "8",
            },
            8,
        ),
        ({"JOB_COMPLETION_INDEX": "1", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}, 3),
        ({"JOB_COMPLETION_INDEX": "3", "SLURM_LOCALID": "1", "PET_NPROC_PER_NODE": "2"}, 7),
        ({"JOB_COMPLETION_INDEX": "4"}, 4),  # one process per pod
    ],
)
def test_indexed_job(env: dict[str, str], rank: int) -> None:
    got = launchers.resolve(env)
    assert got.rank == rank and got.source.startswith("JOB_COMPLETION_INDEX"), got


def test_unknown_ranks_say_why() -> None:
    none = launchers.resolve({"PATH": "/bin"})
    assert none.rank is None and none.reason.startswith("rank unknown: none of RANK,")
    assert "SLURM_PROCID" in none.reason and "JOB_COMPLETION_INDEX" in none.reason
    no_count = launchers.resolve({"JOB_COMPLETION_INDEX": "1", "LOCAL_RANK": "2"})
    assert no_count.rank is None and "processes per pod unknown" in no_count.reason
    no_local = launchers.resolve({"JOB_COMPLETION_INDEX": "1", "LOCAL_WORLD_SIZE": "2"})
    assert no_local.rank is None and "local rank unknown" in no_local.reason
    out_of_range = launchers.resolve(
        {"JOB_COMPLETION_INDEX": "1", "LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"}
    )
    assert out_of_range.rank is None and "out of range" in out_of_range.reason


def test_local_rank_and_world_size_come_along() -> None:
    got = launchers.resolve({"OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                             "OMPI_COMM_WORLD_SIZE": "16"})  # fmt: skip
    assert (got.rank, got.local_rank, got.world_size) == (9, 1, 16)
    assert launchers.resolve({"SLURM_PROCID": "0"}).world_size is None


def test_environ_parsing_keeps_the_first_of_a_name() -> None:
    raw = b"RANK=3\0PATH=/bin\0RANK=4\0junk\0EMPTY=\0=x\0"
    assert launchers.parse_environ(raw) == {"RANK": "3", "PATH": "/bin", "EMPTY": ""}
