"""Ray Tune sweeps: the `sweep` stages (cli.py, stage.py), their trials and results."""
