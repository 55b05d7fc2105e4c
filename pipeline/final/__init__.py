"""Final training: the `train` stages (best sweep config, baselines, equal-time arm)."""
