"""The Ray Serve applications and their builder (``import_path`` of ``deploy/serve.yaml``).

Two applications share one gRPC proxy: ``gambit`` (Coordinator → Target) answers
``gambit.v1.ReasoningService``; ``scorer`` answers ``gambit.v1.ScorerService`` for the Targets.
Clients pick one with the ``application`` metadata key.
"""

from __future__ import annotations

from gambit.deployments.coordinator import Coordinator
from gambit.deployments.scorer import Scorer
from gambit.deployments.target import Target
from gambit.ops.serve_config import timing_options
from gambit.scoring.spec import keeps_history
from gambit.serving.tree_view import RETENTION_S


def build_gambit(args: dict):
    """``args``: tree, prefix, retention_s, token_env, defaults (SolveConfig fields), target (Target
    kwargs), coordinator (more Coordinator kwargs: max_resumes, resume_wait_s), target_replicas,
    target_gpus, coordinator_replicas. ``target_replicas`` is the most Targets
    there can be (an autoscaled Target's max_replicas): the Coordinator tries a run refused for its KV on
    up to that many. The replica counts set here hold only where no config names them: a config's
    ``num_replicas`` or ``autoscaling_config`` replaces them (Serve then ignores the code's count)."""
    tree = args.get("tree", "redis://127.0.0.1:6379/0")
    prefix = args.get("prefix", "gambit:")
    retention = float(args.get("retention_s", RETENTION_S))
    token_env = args.get("token_env", "GAMBIT_TOKEN")
    tkw = dict(args.get("target", {}))
    actor = {"num_cpus": 0}
    gpus = float(args.get("target_gpus", -1))
    if gpus < 0:  # auto: one GPU per Target when the cluster has one
        import ray

        gpus = 1.0 if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
    if gpus:
        actor["num_gpus"] = gpus
    # health checks and stop times: the config's (serve_config.TIMINGS), also where no config names them
    target = Target.options(num_replicas=int(args.get("target_replicas", 1)), ray_actor_options=actor,
                            **timing_options("Target")).bind(
        tree=tree, prefix=prefix, token_env=token_env, retention_s=retention, **tkw)
    return Coordinator.options(num_replicas=int(args.get("coordinator_replicas", 1)),
                               **timing_options("Coordinator")).bind(
        target, tree=tree, prefix=prefix, retention_s=retention, defaults=args.get("defaults"),
        token_env=token_env,
        target_replicas=int(args.get("target_replicas", 1)), **dict(args.get("coordinator", {})))


def build_scorer(args: dict):
    """``args``: Scorer kwargs (scorer, model, hidden_size, max_rows, batch_wait_ms, token_env, max_keys,
    max_state_mb). A sequence scorer keeps each trace's history in its replica, so it runs as one replica,
    not autoscaled (a config file's Scorer settings still override this: ``serve_config`` and the chart
    pin it there too)."""
    if keeps_history(args.get("scorer", "")):
        return Scorer.options(num_replicas=1, autoscaling_config=None,
                              **timing_options("Scorer")).bind(**args)
    return Scorer.options(**timing_options("Scorer")).bind(**args)
