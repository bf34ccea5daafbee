"""Errors that the command line reports as one line with exit code 2."""


class SeqappsError(Exception):
    """Bad usage or bad input: the message names what and where."""


class ConfigError(SeqappsError):
    """A configuration value is unknown, of the wrong type, or out of range."""


class DataError(SeqappsError):
    """Input data is unreadable or invalid; the message names the file, row or column."""


class ExportError(SeqappsError):
    """An export folder is missing, incomplete, or belongs to another pipeline."""


class TrainingError(RuntimeError):
    """Training failed (for example the loss became NaN); reported with exit code 1."""
