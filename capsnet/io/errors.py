"""User-facing errors: the CLI prints these as one line, without a traceback."""


class CapsnetError(Exception):
    """Base class for errors caused by user input (files, options, params)."""


class CheckpointError(CapsnetError):
    """A checkpoint is missing, truncated, foreign or unsafe."""


class DataError(CapsnetError):
    """A dataset file is missing, corrupt or of the wrong format."""


class DatasetDisabled(DataError):
    """A dataset is switched off in params.yaml (its prepared folder holds DISABLED.txt)."""


class ConfigError(CapsnetError):
    """A parameter or option has an unknown name or an invalid value."""


class TrainingDiverged(CapsnetError):
    """Training produced a non-finite loss or non-finite weights (a too-high learning rate)."""


class NonFiniteOutputs(CapsnetError):
    """A model's class scores hold NaN or infinite values (its weights may be finite)."""
