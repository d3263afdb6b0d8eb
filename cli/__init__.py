"""det.cli."""
