"""Data sets that hybridpar can generate locally, without any download.

Each module here defines a real `tfds.core.GeneratorBasedBuilder`; importing the
module registers the builder with TensorFlow Datasets. Nothing is imported
here, so ``import hybridpar.data.builders`` stays cheap; `hybridpar.data.load_tfds`
imports the builders it needs.
"""
