"""det.agent."""
