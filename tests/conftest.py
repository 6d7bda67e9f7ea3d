"""Options for the whole suite (``pytest_addoption`` is only read from initial conftests)."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("collscope", "collscope end to end on a real cluster")
    group.addoption(
        "--cluster",
        default=None,
        metavar="KUBECONFIG",
        help="tests/e2e: also run against the real cluster of this kubeconfig: install the "
        "chart, run the workload image with a fault, wait for its Diagnosis "
        "(tests/e2e/test_cluster.py; README 'End-to-end on kind'). Without it those tests skip.",
    )
    group.addoption(
        "--image-registry",
        default=None,
        metavar="REGISTRY",
        help="with --cluster: registry of the collscope-operator, collscope-agent and "
        "collscope-workload images (else $COLLSCOPE_E2E_IMAGE_REGISTRY, else ghcr.io/collscope)",
    )
    group.addoption(
        "--image-tag",
        default=None,
        metavar="TAG",
        help="with --cluster: tag of those images (else $COLLSCOPE_E2E_IMAGE_TAG, else the "
        "chart's appVersion)",
    )
    group.addoption(
        "--workload-image",
        default=None,
        metavar="IMAGE",
        help="with --cluster: the workload image (else $COLLSCOPE_E2E_WORKLOAD_IMAGE, else "
        "REGISTRY/collscope-workload:TAG)",
    )
