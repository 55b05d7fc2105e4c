"""DVC plumbing: each stage's code deps and the stage table."""
