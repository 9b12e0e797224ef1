"""A real multi-process TensorFlow cluster: ``hybridpar launch`` and ``hybridpar tf-config``.

``hybridpar launch [--engine local|ray] --workers N [--ps M] [--evaluator] [--max-restarts K]
[--timeout S] -- CMD [ARGS...]`` starts one process per task running CMD with its own ``TF_CONFIG``:
on free localhost ports (``--engine local``, the default), or in one Ray actor per
task on ports free on its node (``--engine ray``, see ``ray_engine``). It shows the
chief's output and the other tasks' warnings and errors, prefixed with the task
(``[worker:1] ...``), writes every task's full log to ``--log-dir`` (see ``output``),
stops the whole cluster when a task fails (SIGTERM to each task's process group,
SIGKILL after a grace period) and can start it again on new ports.

In parameter-server mode (``--ps M``) the chief's exit ends the cluster; a failed
worker is restarted alone at its address (the coordinator takes it back) while
restarts are left, else the other workers go on; a lost ps task is left to the
chief to report. ``--max-restarts`` counts both kinds of restart.

``--evaluator`` adds one ``evaluator`` task running CMD too (sidecar evaluation
of the chief's checkpoints). The cluster is done when the chief (every worker,
without ps tasks) and the evaluator are done; an evaluator that fails is
reported, is not restarted and does not stop training or change the exit code.

``hybridpar tf-config --workers h1:p,h2:p [--chief h:p] [--ps h:p,...] [--evaluator h:p]
--type T --index I``
prints the ``TF_CONFIG`` JSON to set on each machine of a real cluster.

Exit codes of ``launch``: 0 when every training task (in parameter-server mode: the
chief) exited 0, whatever the evaluator did; else the code of the first task that
failed (128+signum for a task killed by a signal, 42 for a task preempted by
SIGTERM after saving a checkpoint); 124 on ``--timeout``; 128+signum when the
launcher itself got SIGINT (130), SIGTERM (143) or SIGHUP (129); 127/126 when CMD
cannot be started; 2 for bad command-line input. No TensorFlow here: the package
is plain Python.

Modules: ``options`` (``LaunchOptions``: one launch, every check made once
when it is built; pure), ``tasks`` (layout, environments, exit policies; pure),
``ports`` (addresses and free ports; pure), ``output`` (lines, progress bars,
console, task logs), ``cluster_run`` (one run and the restart loop, any
engine), ``processes`` and ``local`` (the local engine), ``ray_engine`` and
``ray_actor`` (the Ray engine), ``engines`` (``run(options)`` on the engine the
options name; Ray imported only for ``--engine ray``), ``signals``, ``args``
(the command lines).
"""

from __future__ import annotations

from hybridpar.exit_codes import PREEMPTED_EXIT_CODE, TIMEOUT_EXIT_CODE, USAGE_EXIT_CODE
from hybridpar.launch.args import main, parse_launch_args, tf_config_from_args, tf_config_main
from hybridpar.launch.engines import run
from hybridpar.launch.local import launch
from hybridpar.launch.options import LaunchOptions
from hybridpar.launch.tasks import Outcome, UsageError, task_layout
from hybridpar.topology.cluster import Task

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "TIMEOUT_EXIT_CODE",
    "USAGE_EXIT_CODE",
    "LaunchOptions",
    "Outcome",
    "Task",
    "UsageError",
    "launch",
    "main",
    "parse_launch_args",
    "run",
    "task_layout",
    "tf_config_from_args",
    "tf_config_main",
]
