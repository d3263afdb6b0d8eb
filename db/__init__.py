"""det.db."""
