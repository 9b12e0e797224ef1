"""hybridpar's logger: silent by default, as a library's should be.

hybridpar logs to the ``hybridpar`` logger, which has only a ``NullHandler``:
what reaches the screen is the application's choice. ``hybridpar train``
shows INFO lines; a script calls ``hybridpar.log_to_stderr()`` (or configures
``logging`` itself) to see which mode was chosen, how input is sharded,
checkpoints saved and restored, and warnings.
"""

from __future__ import annotations

import logging

LOGGER_NAME = "hybridpar"

logging.getLogger(LOGGER_NAME).addHandler(logging.NullHandler())


def log_to_stderr(level: int | str = logging.INFO) -> logging.Handler:
    """Prints hybridpar's own log lines (``hybridpar: ...``) on stderr from ``level`` up.

    Calling it again only changes the level.

    Returns:
        The handler it added (or found).
    """
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    for handler in logger.handlers:
        if getattr(handler, "_hybridpar_stderr", False):
            return handler
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler._hybridpar_stderr = True
    logger.addHandler(handler)
    logger.propagate = False
    return handler
