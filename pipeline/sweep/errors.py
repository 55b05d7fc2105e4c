"""How a sweep fails: the errors the stage raises and its command reports."""

from __future__ import annotations

from capsnet.io.errors import CapsnetError


class SweepError(CapsnetError):
    """Trials still errored after their retries (the message names them)."""


class SweepInterrupted(CapsnetError):
    """The driver was interrupted; Tune saved its state and the next run resumes."""

    def __init__(self, message: str, experiment_path: str = ""):
        super().__init__(message)
        self.experiment_path = experiment_path
