"""Exception types raised for bad input, before training starts."""


class InputError(ValueError):
    """Bad input from the user: the message says what, the value and what was expected."""


class ConfigError(InputError):
    """A configuration key holds a bad value, or the file cannot be read."""


class DataError(InputError):
    """A dataset cannot be loaded or fails validation."""


class WorkerFailure(RuntimeError):
    """A remote rank failed; the message carries its rank, host and traceback."""
