"""Exceptions raised by hybridpar for bad user input."""


class ConfigError(ValueError):
    """A configuration value, file or runtime combination is invalid.

    The message always names what was received, what is allowed and how to
    fix it.
    """


class RuntimeMismatchError(ConfigError):
    """The configuration does not fit the devices or cluster that exist."""
