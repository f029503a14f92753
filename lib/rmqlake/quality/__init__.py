"""Data quality: Great Expectations suites on the store's invariants (frames in Spark, suites in code)."""
