"""Shared fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray cluster of 2 CPUs for every Ray test of the session (starting one takes
    seconds); shut down at the end."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, configure_logging=False)
    yield ray
    ray.shutdown()
