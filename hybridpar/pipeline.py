"""Pipelining's public names: ``PipelineTimeline`` and ``split_batch``.

The microbatched train step is ``hybridpar.parallel.pipeline``; it runs when
``model_parallel.microbatches > 1`` (see ``hybridpar.compat.microbatch_step``).
"""

from hybridpar.parallel.pipeline import split_batch
from hybridpar.parallel.timeline import PipelineTimeline

__all__ = ["PipelineTimeline", "split_batch"]
