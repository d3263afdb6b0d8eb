"""det.harness."""
