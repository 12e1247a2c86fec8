"""The three-broker cluster the tests of this directory run: ``bench.cluster``'s broker processes (real
``mc0 broker`` processes of this checkout on loopback ports, each with its own data directory), as a
fixture that starts them, waits for a leader every member agrees on, and stops them all at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.cluster import Cluster, Member, make_cluster

__all__ = ["Cluster", "Member", "cluster_factory"]


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Any]:
    """``cluster_factory(curve=False, settings="")``: three brokers started, a leader serving."""
    made: list[Cluster] = []

    def make(**options: Any) -> Cluster:
        cluster = make_cluster(tmp_path, **options)
        made.append(cluster)
        for member in cluster.members:
            cluster.start(member)
        cluster.settled()
        return cluster

    yield make
    for cluster in made:
        cluster.stop_all()
        cluster.context.term()
