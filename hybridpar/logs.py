"""hybridpar's logger: silent by default, as a library's should be.

hybridpar logs to the ``hybridpar`` logger, which has only a ``NullHandler``:
what reaches the screen is the application's choice. ``hybridpar train``
shows INFO lines; a script calls ``hybridpar.log_to_stderr()`` (or configures
``logging`` itself) to see which mode was chosen, how input is sharded,
checkpoints saved and restored, and warnings.

Under ``hybridpar launch`` (which sets ``HYBRIDPAR_LOG_TAGS=1`` in every task)
each line starts with its level between two ``LOG_TAG`` characters, so the
launcher can show other tasks' warnings and hide their INFO lines; it
removes the tag before printing or logging the line.
"""

from __future__ import annotations

import logging
import os

LOGGER_NAME = "hybridpar"
LOG_TAGS_ENV = "HYBRIDPAR_LOG_TAGS"
LOG_TAG = "\x1f"  # ASCII unit separator: never printed by hand, invisible if it leaks

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
    tagged = os.environ.get(LOG_TAGS_ENV) == "1"
    fmt = f"{LOG_TAG}%(levelname)s{LOG_TAG}%(message)s" if tagged else "%(message)s"
    handler.setFormatter(logging.Formatter(fmt))
    handler._hybridpar_stderr = True
    logger.addHandler(handler)
    logger.propagate = False
    return handler
