"""What the source and the sink do once in each of Spark's Python workers: keep the garbage collector that
Spark runs after every task from walking the whole process each time.

A Python worker that Spark reuses (``spark.python.worker.reuse``, on by default) runs ``gc.collect()`` after
every task (``pyspark/daemon.py``): a full collection, which walks every object alive in the process. With
PySpark, pyarrow, numpy and the connector loaded that took 30-90 ms of CPU after each task here (logged with
``gc.callbacks`` during ``python3 -m bench spark``), about as much as turning the task's half of a million
records into Arrow columns; on two cores that time comes out of what the JVM and the other task have.

Nearly everything alive when a worker runs its first mc0 task lives as long as the process: modules, classes,
functions, PySpark's own state. :func:`settle` moves those objects out of the collector's way once
(``gc.freeze()``): reference counting still frees them, and the collections after later tasks walk only what
came since, a few milliseconds. The price is that an object frozen then, if it later becomes garbage caught in
a reference cycle, is never freed; what is frozen is what existed at the first task, once per process.

The source settles the workers that run its read tasks, and the ones that ask a source for its schema and
plan a batch read, which Spark collects after each use too (25-40 ms each time, measured the same way); the
sink, the workers that run its write tasks. Outside a reused Spark worker (the driver, a test, a profile run
in one process) nothing happens.
"""

from __future__ import annotations

import gc
import os

#: Set by Spark in the environment of Python workers it reuses: the ones that collect after every task.
REUSED_WORKER = "SPARK_REUSE_WORKER"

_settled = False


def settle() -> bool:
    """Freeze the objects alive now, once per process, if this is a reused Spark Python worker; True if it
    did so now."""
    global _settled
    if _settled or not os.environ.get(REUSED_WORKER):
        return False
    _settled = True
    gc.freeze()
    return True
