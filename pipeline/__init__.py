"""What only the distributed pipeline needs: Ray Tune sweeps, W&B tracking, final training.

``capsnet`` never imports this package at module level; the CLI loads it lazily.
"""
