"""One SparkSession for every pipeline test: ``local[2,4]`` (two threads, and a failed task is tried again up
to four times, as on a cluster: the exactly-once sink is tested against retries), no UI, the driver bound to
loopback, the mc0 data source registered. Spark starts once (a JVM takes seconds) and stops at the end of the
session. Python workers inherit this process's environment, so they import this checkout's packages."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run the same interpreter (and its packages)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from pipeline.source import register

    session = (
        SparkSession.builder.master("local[2,4]").appName("mc0-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    register(session)
    yield session
    session.stop()
