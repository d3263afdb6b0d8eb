"""det.reconciler.searchers."""
