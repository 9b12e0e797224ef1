"""What this process runs on, as pure data: the cluster, the device mesh, stage rules, the plan.

No TensorFlow here: ``cluster`` reads and writes ``TF_CONFIG``, ``mesh`` lays
devices out as replicas x stages, ``placement`` maps layers to stages,
``ps_cluster`` checks parameter-server clusters, and ``plan`` checks a config
against the runtime before any strategy is built.
"""
