"""Exceptions raised by hybridpar: bad user input, damaged checkpoints, a lost cluster."""


class ConfigError(ValueError):
    """A configuration value, file or runtime combination is invalid.

    The message always names what was received, what is allowed and how to
    fix it.
    """


class RuntimeMismatchError(ConfigError):
    """The configuration does not fit the devices or cluster that exist."""


class CheckpointDamagedError(RuntimeError):
    """A checkpoint on disk is incomplete, truncated or does not match its checksum."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (a full disk, an I/O error); earlier checkpoints are intact.

    An ``OSError``, as the failed write itself was when checkpoints were
    written in the training thread.
    """


class CheckpointMismatchError(ConfigError):
    """A checkpoint was written by a different model or optimizer than it is restored into."""


class InputPositionError(CheckpointMismatchError):
    """A checkpoint's saved input position lies past the end of the input it is restored
    into: resuming would train on nothing."""


class ParameterServerUnavailableError(RuntimeError):
    """A parameter server stopped answering; training cannot go on without it."""
