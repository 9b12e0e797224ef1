"""The ``hybridpar`` command: ``train``, ``launch``, ``tf-config`` and ``checkpoint``.

``main`` only dispatches: ``hybridpar train`` lives in ``cli.train_command`` (it
imports TensorFlow), ``launch`` and ``tf-config`` in ``hybridpar.launch``
(plain Python), ``checkpoint export`` in ``hybridpar.checkpoint.export``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from hybridpar.config import did_you_mean

COMMANDS = {
    "train": "train a model from a config (see `hybridpar train --helpfull`)",
    "launch": "start a cluster: hybridpar launch [--engine local|ray] --workers N [--ps M] "
              "[--evaluator] -- CMD ...",
    "tf-config": "print the TF_CONFIG for one task of a cluster",
    "checkpoint": "checkpoint export CKPT --to model.weights.h5: weights for plain Keras",
}
USAGE = "usage: hybridpar COMMAND [FLAGS]\n\ncommands:\n" + "".join(
    f"  {name:11s}{text}\n" for name, text in COMMANDS.items()
)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``hybridpar`` console script."""
    argv = list(sys.argv if argv is None else argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(USAGE, end="")
        sys.exit(0 if len(argv) >= 2 else 2)
    command = argv[1]
    if command not in COMMANDS:
        print(
            f"hybridpar: unknown command {command!r}.{did_you_mean(command, COMMANDS)}\n{USAGE}",
            file=sys.stderr,
        )
        sys.exit(2)
    if command == "train":
        from hybridpar.cli import train_command

        train_command.run([f"hybridpar {command}", *argv[2:]])
    if command == "checkpoint":
        from hybridpar.checkpoint import export

        sys.exit(export.main(argv[2:]))
    from hybridpar.launch import args

    run = args.main if command == "launch" else args.tf_config_main
    sys.exit(run(argv[2:]))
