"""det.configs."""
