"""The harness: MLPerf logging, the log checker and plots."""
