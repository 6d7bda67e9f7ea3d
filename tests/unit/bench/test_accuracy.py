"""bench/accuracy.py: scoring a directory laid out like ../shared/eval-dev/ (``--bundles``), the
bundle without ``hw`` records (``--strip-hw``), and the calibration numbers (reliability bins,
Brier score) on hand-made outcomes."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from collscope.nodeagent.bundle import models, reader, writer
from collscope.operator.analysis import engine as analysis
from collscope.operator.analysis import summaries
from collscope.operator.simulator import config, engine, truth

ROOT = Path(__file__).resolve().parents[3]
# 16 ranks = two nodes of 8 (TP8 x DP2): the smallest job with a node to get wrong; 6 s of
# simulated time holds a baseline before the 3 s onset and a hang well after it.
SMALL: dict[str, Any] = {"ranks": 16, "tp": 8, "pp": 1, "dp": 2, "duration_s": 6.0, "onset_s": 3.0}
SHAPE = [8, 1, 2]


def _load_accuracy() -> Any:
    name = "collscope_bench_accuracy"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "accuracy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


acc = _load_accuracy()


def _simulate(fault: str, seed: int) -> engine.SimResult:
    return engine.simulate(config.SimConfig(**SMALL, fault=truth.Fault.from_name(fault), seed=seed))


def _truth_json(fault: str, onset: int | None, culprits: list[int], category: str | None) -> str:
    tp, pp, dp = SHAPE
    shape = {"tp": tp, "pp": pp, "dp": dp}
    return json.dumps(
        {"fault": fault, "onset": onset, "culprits": culprits, "category": category, "shape": shape}
    )


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, int]:
    """(root, culprit, onset): a fault-free case and a GPU hang, written as eval-dev lays them
    out, plus the hang's bundle twice more under other truths, to see rank and node scored
    apart: culprit = a neighbour on the same node, then a rank on the other node with another
    category."""
    root = tmp_path_factory.mktemp("eval")
    healthy, hang = _simulate("none", 100), _simulate("gpu-hang", 0)
    (culprit,), onset = hang.truth.culprit_ranks, hang.truth.onset
    assert onset is not None
    neighbour, elsewhere = culprit ^ 1, (culprit + 8) % 16
    cases = [
        ("case-000", "none", healthy, _truth_json("none", None, [], None)),
        ("case-001", "gpu-hang", hang, _truth_json("gpu-hang", onset, [culprit], "hang.gpu")),
        ("case-002", "same-node", hang, _truth_json("gpu-hang", onset, [neighbour], "hang.gpu")),
        ("case-003", "other-node", hang, _truth_json("gpu-slow", onset, [elsewhere], "slow.gpu")),
    ]
    for name, _, result, truth_text in cases:
        writer.write(result.bundle, root / name, extra_files={"truth.json": truth_text})
    index = [{"case": name, "kind": kind, "shape": SHAPE} for name, kind, _, _ in cases]
    (root / "index.json").write_text(json.dumps(index))
    return root, culprit, onset


def test_bundles_are_scored_case_by_case(eval_dir: tuple[Path, int, int]) -> None:
    root, culprit, onset = eval_dir
    got = [acc.run_bundle(c) for c in acc.bundle_cases(root)]
    # The analysis itself, run here on the same files: the bench must report what it said.
    # (with the job-wide rows each tick, as the bench replays the live pull: cbe180d)
    diag = analysis.diagnose(reader.load(root / "case-001"), summaries=summaries.Summaries())
    assert diag.anomaly and diag.detected_at is not None
    where = {r.rank: r.node for r in reader.load(root / "case-001").job.ranks}
    assert where[culprit] == where[culprit ^ 1] != where[(culprit + 8) % 16]
    verdict: dict[str, Any] = {
        "faulty": True,
        "hang": True,
        "detected": True,
        "category": "hang.gpu",
        "top_rank": culprit,
        "confidence": diag.confidence,
        "latency_s": (diag.detected_at - onset) / 1e9,
        "ranks": 16,
        "variant": "tp8 pp1 dp2",
        "tied": (),  # a GPU hang: one culprit, no tie
        "tie_why": "",
    }
    quiet: dict[str, Any] = {"faulty": False, "hang": False, "detected": False, "category": None}
    quiet |= {"top_rank": None, "confidence": 0.0, "latency_s": None, "tied": (), "tie_why": ""}
    expected = [
        quiet
        | {"case": "case-000", "family": "none", "top1": True, "node_ok": True}
        | {"category_ok": True, "truth_category": None, "truth_culprits": ()}
        | {"ranks": 16, "variant": "tp8 pp1 dp2"},
        verdict
        | {"case": "case-001", "family": "gpu-hang", "top1": True, "node_ok": True}
        | {"category_ok": True, "truth_category": "hang.gpu", "truth_culprits": (culprit,)},
        verdict
        | {"case": "case-002", "family": "same-node", "top1": False, "node_ok": True}
        | {"category_ok": True, "truth_category": "hang.gpu", "truth_culprits": (culprit ^ 1,)},
        verdict
        | {"case": "case-003", "family": "other-node", "top1": False, "node_ok": False}
        | {"category_ok": False, "truth_category": "slow.gpu", "hang": False}
        | {"truth_culprits": ((culprit + 8) % 16,)},
    ]
    timings = {"analysis_s", "prepare_s"}
    assert [{k: v for k, v in dataclasses.asdict(o).items() if k not in timings} for o in got] == [
        dict(sorted(e.items())) for e in expected
    ]
    assert [o.right for o in got] == [True, True, False, False]
    assert all(o.analysis_s > 0 and o.prepare_s > 0 for o in got)


def test_bundles_report(
    eval_dir: tuple[Path, int, int], capsys: pytest.CaptureFixture[str]
) -> None:
    root, culprit, _ = eval_dir
    assert acc.main(["--bundles", str(root), "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    # name, cases, detected, top-1, right node, category: the cells that do not vary by run
    rows = ["|".join(line.split("|")[:7]) + "|" for line in out.splitlines()]
    for row in [
        "| none (false alarms) | 1 | 0 alarms | - | - | - |",
        "| gpu-hang | 1 | 100% | 100% | 100% | 100% |",
        "| same-node | 1 | 100% | 0% | 100% | 100% |",
        "| other-node | 1 | 100% | 0% | 0% | 0% |",
        "| **all faults** | 3 | 100% | 33% | 67% | 67% |",
    ]:
        assert row in rows, out
    wrong = out.split("misdiagnosed cases", 1)[1].splitlines()[1:]
    assert [line.split(" (")[0].strip() for line in wrong] == ["case-002", "case-003"]
    assert f"rank {culprit}, confidence" in wrong[0]
    assert wrong[1].endswith(f"truth: slow.gpu, ranks {(culprit + 8) % 16}")


def test_bad_bundle_directories_are_named(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('[{"case": "case-000"}]')
    with pytest.raises(ValueError, match=r"index\.json"):
        acc.bundle_cases(tmp_path)
    (tmp_path / "truth.json").write_text('{"fault": "none"}')
    with pytest.raises(ValueError, match=r"truth\.json"):
        acc.read_expected(tmp_path / "truth.json")
    with pytest.raises(SystemExit):
        acc.main(["--bundles", str(tmp_path), "--quick"])


def test_strip_hw_drops_only_the_hardware_samples() -> None:
    bundle = _simulate("nic-down", 0).bundle
    assert len(bundle.hw) > 0
    bare = acc.without_hw(bundle)
    assert len(bare.hw) == 0 and bare.job == bundle.job
    # The same records bar hw; rows tied on (rank, time) may change places, as the tables are
    # sorted by communicator index after time and the builder numbers communicators anew.
    kept = [r for r in bundle.iter_records() if not isinstance(r, models.HwRecord)]
    assert sorted(r.model_dump_json() for r in bare.iter_records()) == sorted(
        r.model_dump_json() for r in kept
    )
    # The names only hw records used (metrics) leave the string table.
    metrics = {bundle.string(int(i)) for i in bundle.hw["metric"]}
    assert "nic_link_up" in metrics and not metrics & set(bare.strings)


def _outcome(*, detected: bool, confidence: float, right: bool, faulty: bool = True) -> Any:
    return acc.Outcome(
        case="c",
        family="f",
        variant="v",
        ranks=16,
        faulty=faulty,
        hang=False,
        detected=detected,
        top1=right,
        node_ok=right,
        category_ok=right,
        category="slow.gpu" if detected else None,
        top_rank=0 if detected else None,
        confidence=confidence,
        truth_category="slow.gpu" if faulty else None,
        truth_culprits=(0,) if faulty else (),
        latency_s=None,
        analysis_s=0.0,
        prepare_s=0.0,
    )


HAND_MADE = [
    _outcome(detected=True, confidence=0.3, right=False),
    _outcome(detected=True, confidence=0.5, right=True),  # 0.5 opens the second bin
    _outcome(detected=True, confidence=0.8, right=False),
    _outcome(detected=True, confidence=0.95, right=True),
    _outcome(detected=True, confidence=1.0, right=True),  # the last bin is closed
    _outcome(detected=False, confidence=0.0, right=False),  # a missed fault: no verdict
    _outcome(detected=False, confidence=0.0, right=True, faulty=False),  # quiet when healthy
    _outcome(detected=True, confidence=0.9, right=False, faulty=False),  # a false alarm
]


def test_reliability_bins_count_verdicts_and_rights() -> None:
    bins = [(b.lo, b.hi, b.verdicts, b.right) for b in acc.reliability(HAND_MADE)]
    assert bins == [(0.0, 0.5, 1, 0), (0.5, 0.8, 1, 1), (0.8, 0.95, 2, 0), (0.95, 1.0, 2, 2)]
    assert [b.verdicts for b in acc.reliability(HAND_MADE[5:7])] == [0, 0, 0, 0]


def test_brier_score_over_anomaly_verdicts() -> None:
    # (0.3-0)^2 + (0.5-1)^2 + (0.8-0)^2 + (0.95-1)^2 + (1-1)^2 + (0.9-0)^2, over 6 verdicts
    assert acc.brier(HAND_MADE) == pytest.approx(1.7925 / 6, abs=1e-12)
    assert acc.brier([_outcome(detected=True, confidence=1.0, right=True)]) == 0.0
    assert acc.brier(HAND_MADE[5:7]) is None
    text = acc.calibration(HAND_MADE)
    assert "| [0.95, 1.00] | 2 | 2 | 100% |" in text
    assert "| [0.80, 0.95) | 2 | 0 | 0% |" in text
    assert "Brier score over the 6 anomaly verdicts: 0.299 " in text
    assert "fault-free cases that raised an anomaly: 1 of 2" in text
    assert "faulty cases with no verdict: 1 of 6" in text


def test_ties_table_separates_declared_ties_from_identifiable_cases() -> None:
    right = _outcome(detected=True, confidence=0.9, right=True)
    wrong = _outcome(detected=True, confidence=0.9, right=False)
    tie_ok = dataclasses.replace(wrong, tied=(3, 0), confidence=0.5)  # truth 0 among the tied
    tie_bad = dataclasses.replace(wrong, tied=(3, 4), confidence=0.5)
    table = acc.ties([right, wrong, tie_ok, tie_bad], ["f"])
    assert table.splitlines()[2] == "| f | 4 | 2 | 1 of 2 | 50% of 2 |"
    assert acc.tie_cases([right, tie_ok]) == ["  c: tied ranks [3, 0], truth [0]"]
