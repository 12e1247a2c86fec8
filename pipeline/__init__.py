"""The data pipeline on Apache Spark: ``pipeline.source`` is the ``mc0`` PySpark data source (topics as batch
and streaming DataFrames), ``pipeline.sink`` its writers (DataFrames into topics, exactly once),
``pipeline.options`` the options both check, ``pipeline.arrow`` the records-to-Arrow step of a read, and
``pipeline.log_counts`` an example streaming job.

Nothing here is imported by the broker or the connector: PySpark is an optional dependency (``.[spark]``).
"""
