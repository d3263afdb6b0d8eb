"""det.reconciler."""
