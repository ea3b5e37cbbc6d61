"""CLI wiring for `gambit deploy generate|check` and `gambit cluster status|wait` (logic lives beside)."""

from __future__ import annotations

import sys
from pathlib import Path

from gambit.config_cli import add_dataclass_args, from_args
from gambit.ops.cluster import ClusterConfig
from gambit.paths import REPO


def _deploy(args) -> int:
    from gambit.ops.generate import VALUES, NotACheckout, check, checkout, generate

    here = Path.cwd()  # a checkout run from, else the one this gambit is installed from (editable)
    try:
        root = checkout(Path(args.root) if args.root else here if (here / VALUES).is_file() else REPO)
    except NotACheckout as e:
        print(f"{args._prog}: error: {e}", file=sys.stderr)
        return 2
    if args.action == "generate":
        written = generate(root)
        print("\n".join(f"wrote {p}" for p in written) or f"{root}: deploy/ is up to date")
        return 0
    diffs = check(root)
    for d in diffs:
        print(d, end="")
    print(f"{root}: {len(diffs)} generated file(s) out of date" if diffs
          else f"{root}: deploy/ matches the code")
    return 1 if diffs else 0


def _cluster(args) -> int:
    from gambit.ops.cluster import ClusterUnreachable, api_client, api_errors, fetch_status, wait_ready

    cfg = from_args(ClusterConfig, args)
    api = None
    try:
        api = api_client(cfg)
        if args.action == "status":
            st = fetch_status(cfg, api)
            print(st.format())
            return 0 if st.ready else 1
        st = wait_ready(cfg, api)
    except TimeoutError as e:
        print(f"{args._prog}: error: {e}", file=sys.stderr)
        return 1
    except ClusterUnreachable as e:
        print(f"{args._prog}: error: {e}", file=sys.stderr)
        return 2
    except api_errors() as e:
        host = api.configuration.host if api is not None else "?"
        why = f"HTTP {e.status} {e.reason}" if getattr(e, "status", None) else f"{type(e).__name__}: {e}"
        print(f"{args._prog}: error: the Kubernetes API at {host}: {why}", file=sys.stderr)
        return 2
    print(st.format())
    return 0


def _loadtest(args) -> int:
    from gambit.ops.loadtest import LoadTestConfig, main

    return main(from_args(LoadTestConfig, args))


def add_ops_commands(sub) -> None:
    d = sub.add_parser("deploy", help="deploy/ files (Serve config, alerts, dashboards) generated from code")
    d.add_argument("action", choices=["generate", "check"],
                   help="write the files, or diff them (exit 1 on drift)")
    d.add_argument("--root", default="", help="the Gambit checkout to write or check (a folder holding "
                   "helm/gambit/values.yaml; default: the current folder if it is one, else the checkout "
                   "this gambit is installed from)")
    d.set_defaults(func=_deploy, _prog=d.prog)  # its error lines open with the command
    c = sub.add_parser("cluster", help="the RayService on Kubernetes: status, or wait until it serves")
    csub = c.add_subparsers(dest="action", required=True)
    # one parser each: `cluster status --help` listed --timeout-s / --poll-s, which only `wait` reads
    cs = csub.add_parser("status", help="print the RayService's conditions, apps and pods (exit 1 if not "
                         "ready)")
    add_dataclass_args(cs, ClusterConfig, skip=("timeout_s", "poll_s"))
    cw = csub.add_parser("wait", help="block until the RayService serves (exit 1 at --timeout-s)")
    add_dataclass_args(cw, ClusterConfig)
    for parser in (cs, cw):
        parser.set_defaults(func=_cluster)
    from gambit.ops.loadtest import LoadTestConfig

    lt = sub.add_parser("loadtest", help="Locust gRPC load test, headless and bounded, against a local "
                        "deployment it starts (or --address); prints percentiles, throughput, failures")
    add_dataclass_args(lt, LoadTestConfig)
    lt.set_defaults(func=_loadtest)
