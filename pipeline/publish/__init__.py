"""The publish stage: report, results table, README block and W&B runs."""
