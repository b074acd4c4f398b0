"""Shared pytest set-up: tests marked ``gpu`` need a CUDA device and skip cleanly without one
(``scripts/device/gpu_tests.sh`` runs exactly them on the GPU machine and fails on a skip); one
local Ray cluster serves every Ray test of the session."""

from __future__ import annotations

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray cluster of 2 CPUs (starting one takes seconds), shut down at the end."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()
