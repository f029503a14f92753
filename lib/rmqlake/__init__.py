"""rmqlake: Apache RocketMQ's broker storage rebuilt as Delta Lake tables by Spark batch jobs."""

__version__ = "0.1.0"
