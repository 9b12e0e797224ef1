"""hybridpar's trainer: what Keras's trainer methods run for models under its strategies."""

from hybridpar.training.trainer import Trainer, fit_arguments

__all__ = ["Trainer", "fit_arguments"]
