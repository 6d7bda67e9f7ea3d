"""Options for the whole suite (``pytest_addoption`` is only read from initial conftests)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cluster",
        default=None,
        metavar="KUBECONFIG",
        help="tests/e2e: run against the real cluster of this kubeconfig (not implemented yet: "
        "those tests skip)",
    )
