"""The data pipeline on Apache Spark: ``pipeline.source`` is the ``mc0`` PySpark data source (topics as batch
and streaming DataFrames, DataFrames into topics), ``pipeline.log_counts`` an example streaming job.

Nothing here is imported by the broker or the connector: PySpark is an optional dependency (``.[spark]``).
"""
