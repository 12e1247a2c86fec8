"""The ``mc0`` source and sink on Spark's multi-process test master, ``local-cluster[2,1,1024]``: two workers
whose executors are JVMs of their own with Python workers of their own, reaching the broker over the network
only, as on a real cluster. Spark allows one SparkContext per process, so the job runs in a process of its own
(``cluster_job.py``); this test starts the broker, fills the topic, and checks what the job read and wrote,
and that a write task whose first attempt died mid-write, run again by Spark on the cluster, stored every row
exactly once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_exactly_once import all_bodies

from broker.server import Broker
from broker.topics import Persistence, TopicRule, TopicSpec
from connector import Client

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 10_000


def test_a_local_cluster_reads_and_writes_through_the_broker(
    start_broker: Callable[..., Broker], tmp_path: Path
) -> None:
    broker = start_broker(topics=(TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),))
    with Client(broker.endpoint, curve=False) as client:
        for first in range(0, MESSAGES, 2000):
            client.publish_batch([("cluster.in", b"x" * (n % 50), None) for n in range(first, first + 2000)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    marks = tmp_path / "attempts"
    marks.mkdir()
    job = subprocess.run([sys.executable, str(Path(__file__).with_name("cluster_job.py")), broker.endpoint,
                          "cluster.in", "cluster.out", "cluster.retried", str(marks)], env=env,
                         capture_output=True, text=True, timeout=280, check=False)
    assert job.returncode == 0, job.stderr[-3000:]
    seen = json.loads(job.stdout.strip().splitlines()[-1])
    assert seen["rows"] == MESSAGES
    assert seen["bytes"] == sum(n % 50 for n in range(MESSAGES))
    assert (seen["first"], seen["last"]) == (1, MESSAGES)
    assert seen["tasks"] == 4, "10,000 messages at 2,500 per task"
    assert seen["worker_processes"] >= 2, "tasks ran in Python workers of two executors"
    with Client(broker.endpoint, curve=False) as client:
        offsets = client.offsets("cluster.out")
        stats = client.topics()["cluster.out"]
    assert offsets == (1, MESSAGES + 1), "every row written, once"
    assert stats["duplicates"] == 0
    # The retried write: task 0's first attempt died mid-write, Spark ran it again, every row landed once.
    attempts = sorted(tuple(int(part) for part in mark.name.split("-")) for mark in marks.iterdir())
    assert [(partition, attempt) for partition, attempt, _ in attempts] == [(0, 0), (0, 1), (1, 0)], attempts
    assert attempts[0][2] != attempts[1][2], "the second attempt ran in another Python worker"
    expected = [f"t{task}-{n}".encode() for task in (0, 1) for n in range(seen["retried_rows_per_task"])]
    assert sorted(all_bodies(broker, "cluster.retried")) == sorted(expected), "every row, once"
    with Client(broker.endpoint, curve=False) as client:
        retried = client.topics()["cluster.retried"]
    assert retried["duplicates"] >= 4000, "the first attempt stored rows; the second did not store them again"
    assert retried["messages_in"] == 2 * seen["retried_rows_per_task"]
