"""The evidence: the results store, statistics, run metadata and the report."""
