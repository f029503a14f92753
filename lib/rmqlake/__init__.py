"""rmqlake: Apache RocketMQ's broker storage rebuilt as Delta Lake tables by Spark batch jobs."""

from rmqlake.spark_worker import in_spark_worker, keep_zip_importers

__version__ = "0.1.0"

if in_spark_worker():
    keep_zip_importers()
