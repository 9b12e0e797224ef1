"""Model parallelism: stage placement, microbatch pipelining, and its schedule.

``staging`` says where each stage's variables and ops go, ``pipeline`` is
the microbatched train step, ``timeline`` records the schedule a few steps
ran, and ``schedule`` (pure Python) measures and draws it.
"""
