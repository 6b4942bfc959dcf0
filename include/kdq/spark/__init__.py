"""Spark-side code: the session factory, the pure transforms and the Delta writers."""
