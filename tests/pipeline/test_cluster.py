"""The ``mc0`` source and sink on Spark's multi-process test master, ``local-cluster[2,1,1024]``: two workers
whose executors are JVMs of their own with Python workers of their own, reaching the broker over the network
only, as on a real cluster. Spark allows one SparkContext per process, so the job runs in a process of its own
(``cluster_job.py``); this test starts the broker, fills the topic, and checks what the job read and wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from broker.server import Broker
from broker.topics import Persistence, TopicRule, TopicSpec
from connector import Client

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 10_000


def test_a_local_cluster_reads_and_writes_through_the_broker(start_broker: Callable[..., Broker]) -> None:
    broker = start_broker(topics=(TopicRule("*", TopicSpec(persistence=Persistence.PERSISTENT)),))
    with Client(broker.endpoint, curve=False) as client:
        for first in range(0, MESSAGES, 2000):
            client.publish_batch([("cluster.in", b"x" * (n % 50), None) for n in range(first, first + 2000)])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "SPARK_LOCAL_IP": "127.0.0.1"}
    job = subprocess.run([sys.executable, str(Path(__file__).with_name("cluster_job.py")), broker.endpoint,
                          "cluster.in", "cluster.out"], env=env, capture_output=True, text=True, timeout=280,
                         check=False)
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
