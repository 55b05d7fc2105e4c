"""Training: the run recipe, fit, scoring, the device and precision policy."""
