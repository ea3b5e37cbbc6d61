"""CLI glue for ``gambit serve``, ``gambit client solve`` and ``gambit scorer serve``."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

from gambit.config_cli import add_dataclass_args, flag_error, from_args


def stop_signals() -> Callable[[], int]:
    """Handle SIGINT and SIGTERM from now on; returns the wait: it blocks until one came and gives its
    number. Set before a server says it is ready (a signal right after that line is handled too), and
    set here rather than left to Python: a process started in the background by a script inherits SIGINT
    ignored (so Ctrl-C or ``kill -INT`` did nothing), and SIGTERM (Kubernetes, systemd) killed it before
    its cleanup ran."""
    stop, got = threading.Event(), []

    def on_signal(signum, _frame) -> None:
        got.append(signum)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)

    def wait() -> int:
        while not stop.wait(1.0):  # a timed wait: the main thread runs Python handlers between waits
            pass
        return got[0]

    return wait


def _cmd_serve(args) -> int:
    from gambit.deployments import local
    from gambit.serving.security import open_server_warning

    cfg = from_args(local.ServeConfig, args)
    print(f"starting Ray Serve (gRPC proxy on port {cfg.grpc_port} of every interface, HTTP proxy on "
          f"{cfg.host}:{cfg.http_port}, metrics on :{cfg.metrics_port}) ...", flush=True)
    local.start(cfg)
    wait = stop_signals()  # after ray.init, which sets its own SIGTERM handler; before the ready line
    # Ray 2.60 binds its gRPC proxy to [::] whatever --host says (grpc_options has no host)
    warn = open_server_warning(f"Ray Serve's gRPC proxy on [::]:{cfg.grpc_port} (Ray binds it to every "
                               "interface, never 127.0.0.1 alone; --host moves the HTTP proxy only)",
                               cfg.token_env)
    if warn:
        print(warn, file=sys.stderr, flush=True)
    print(f"ready: ReasoningService at 127.0.0.1:{cfg.grpc_port} (metadata application=gambit); "
          f"try: gambit client solve --address 127.0.0.1:{cfg.grpc_port} \"Compute (14+25)*3.\"; "
          "Ctrl-C stops", flush=True)
    try:
        print(f"{signal.Signals(wait()).name}: stopping", flush=True)
        _drain(cfg)
    finally:
        local.stop()
    return 0


def _drain(cfg) -> None:
    """The runs in flight end with a Result (``cancelled``, "server shutting down") before Serve goes;
    whatever fails here, the stop goes on."""
    from gambit.deployments.drain import drain, target_replicas
    from gambit.serving.tree_view import open_tree_view

    try:
        tree = open_tree_view(cfg.tree, cfg.prefix)
        stopped = drain(tree, target_replicas())
    except Exception as e:  # noqa: BLE001 — Redis gone, Ray half down: stop anyway
        print(f"runs in flight not drained ({type(e).__name__}: {e})", flush=True)
        return
    if stopped:
        print(_drained(tree, stopped), flush=True)


def _drained(tree, stopped: list[str]) -> str:
    """What the drain did, as the records say now: it said "N run(s) ended cancelled" of every run it
    flagged, also of those still running when its wait ran out (their clients got no Result)."""
    from gambit.deployments.drain import SHUTTING_DOWN
    from gambit.serving.tree_view import ENDED

    ended: dict[str, int] = {}
    for run_id in stopped:
        try:
            status = str((tree.get_run(run_id) or {}).get("status") or "")
        except Exception:  # noqa: BLE001 — Redis gone: not known to have ended
            status = ""
        if status in ENDED:
            ended[status] = ended.get(status, 0) + 1
    n = sum(ended.values())
    said = f"{SHUTTING_DOWN}: {n} of {len(stopped)} run(s) in flight ended"
    if ended:
        said += " (" + ", ".join(f"{k} {v}" for k, v in sorted(ended.items())) + ")"
    if n < len(stopped):
        said += (f"; {len(stopped) - n} had not ended when the drain's wait ran out (no Result reached "
                 "their clients; GetRun shows how they end)")
    return said


def _utf8(args, name: str, text: str) -> str:
    """``text`` where it is UTF-8; else a flag error naming ``name`` and the first byte that is not: a
    non-UTF-8 argument or pipe arrives as surrogates, and protobuf's "'utf-8' codec can't encode
    character '\\udcff' in position 8" named no field."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        c = ord(text[e.start])
        byte = f"byte {c - 0xDC00:#04x}" if 0xDC80 <= c <= 0xDCFF else f"U+{c:04X}"
        raise flag_error(args, f"{name}: not UTF-8 text ({byte} at character {e.start})") from None
    return text


def _cmd_client_solve(args) -> int:
    from gambit.serving.client import ClientConfig, solve

    cfg = from_args(ClientConfig, args)
    try:
        problem = sys.stdin.read() if args.problem == "-" else args.problem  # a multi-line problem, piped
    except UnicodeDecodeError as e:  # a strict stdin (surrogateescape's is checked below)
        raise flag_error(args, f"problem -: not UTF-8 text (byte {e.object[e.start]:#04x})") from None
    problem = _utf8(args, "problem" if args.problem != "-" else "problem -", problem)
    _utf8(args, "--run-id", cfg.run_id)
    if not problem.strip():  # an empty pipe sent "" to the server, as `gambit run --question -` refuses
        said = ("problem -: read nothing from stdin" if args.problem == "-" else
                f"problem {args.problem!r}: empty; give the problem's text (- reads it from stdin)")
        raise flag_error(args, said)
    return solve(problem, cfg)


def _cmd_client_get(args) -> int:
    from gambit.serving.client import ConnectConfig, get_run

    return get_run(_utf8(args, "run_id", args.run_id), from_args(ConnectConfig, args))


def _cmd_client_cancel(args) -> int:
    from gambit.serving.client import ConnectConfig, cancel_run

    return cancel_run(_utf8(args, "run_id", args.run_id), from_args(ConnectConfig, args))


def _loopback(host: str) -> bool:
    """Whether ``host`` answers this machine alone (no warning needed without a token)."""
    import ipaddress

    try:
        return host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to any interface
        return False


def _cmd_scorer_serve(args) -> int:
    from gambit.serving.scorer_server import ScorerServerConfig, start_scorer_server
    from gambit.serving.security import open_server_warning

    cfg = from_args(ScorerServerConfig, args)
    wait = stop_signals()
    srv = start_scorer_server(cfg)
    warn = "" if _loopback(cfg.host) else open_server_warning(f"ScorerService on {cfg.host}:{srv.port}",
                                                              cfg.token_env)
    if warn:
        print(warn, file=sys.stderr, flush=True)
    metrics = f"metrics on {cfg.host}:{srv.metrics_port}" if srv.metrics_port >= 0 else "metrics off"
    print(f"ScorerService on {cfg.host}:{srv.port}, {metrics}; Ctrl-C stops", flush=True)
    try:
        print(f"{signal.Signals(wait()).name}: stopping", flush=True)
    finally:
        srv.stop()
    return 0


def add_commands(sub) -> None:
    from gambit.deployments.local import ServeConfig
    from gambit.serving.client import ClientConfig, ConnectConfig
    from gambit.serving.scorer_server import ScorerServerConfig

    s = sub.add_parser("serve", help="start Ray Serve locally: Coordinator, Target, Scorer over gRPC")
    add_dataclass_args(s, ServeConfig)
    s.set_defaults(func=_cmd_serve)

    c = sub.add_parser("client", help="call the ReasoningService")
    csub = c.add_subparsers(dest="what", required=True)
    cs = csub.add_parser("solve", help="solve one problem and print the stream")
    cs.add_argument("problem", help="the problem text, e.g. \"Compute (14+25)*3.\" (- reads it from stdin)")
    add_dataclass_args(cs, ClientConfig, skip=("rpc_timeout_s",))  # a Solve stream runs until its result
    cs.set_defaults(func=_cmd_client_solve)
    cg = csub.add_parser("get", help="a run's status, last round and result (GetRun, from Redis)")
    cg.add_argument("run_id", help="the run id Solve's first event gave")
    add_dataclass_args(cg, ConnectConfig)
    cg.set_defaults(func=_cmd_client_get)
    cc = csub.add_parser("cancel", help="stop a run in flight and free its KV (CancelRun)")
    cc.add_argument("run_id", help="the run id Solve's first event gave")
    add_dataclass_args(cc, ConnectConfig)
    cc.set_defaults(func=_cmd_client_cancel)

    sc = sub.add_parser("scorer", help="the standalone ScorerService")
    scsub = sc.add_subparsers(dest="what", required=True)
    scs = scsub.add_parser("serve", help="serve a scorer over gRPC (no Ray)")
    add_dataclass_args(scs, ScorerServerConfig, skip=("tls",))
    scs.set_defaults(func=_cmd_scorer_serve)
