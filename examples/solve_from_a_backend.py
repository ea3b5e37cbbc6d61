"""A backend calling Gambit over gRPC with nothing of Gambit installed: grpcio, grpcio-tools and the
``.proto`` files. A backend generates the stubs once, in its build:

    mkdir -p gen && python -m grpc_tools.protoc -Iprotos/gambit/v1 --python_out=gen \\
        --grpc_python_out=gen protos/gambit/v1/reasoning.proto

and then (against ``gambit serve``, or the cluster's gRPC endpoint):

    python examples/solve_from_a_backend.py --stubs gen "Compute (14+25)*3."

Without ``--stubs`` this script generates them into a temporary folder first. Two things a backend must
send: the ``application`` metadata (Ray Serve's gRPC proxy routes by it), and, when the servers have a
token (``GAMBIT_TOKEN``), ``authorization: Bearer <token>``. A bad request ends the stream with
``INVALID_ARGUMENT`` and a message that starts with the field. Gambit's gRPC port speaks plaintext;
``--tls-ca`` (and ``--tls-server-name``) are for a TLS-terminating proxy in front of it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path

import grpc

PROTOS = Path(__file__).resolve().parents[1] / "protos" / "gambit" / "v1"
GENERATE = ("mkdir -p gen && python -m grpc_tools.protoc -Iprotos/gambit/v1 --python_out=gen "
            "--grpc_python_out=gen protos/gambit/v1/reasoning.proto")
UINT32 = 2**32 - 1  # SolveRequest.capacity is a uint32: a value outside it was a ValueError traceback


def stubs(folder: str) -> tuple:
    """``reasoning_pb2`` and ``reasoning_pb2_grpc`` from ``folder`` ("": generated into a temporary one,
    removed once they are imported: each run left a ``gambit-stubs-*`` folder behind in /tmp)."""
    if folder:
        return _import(folder)
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="gambit-stubs-") as tmp:
        if protoc.main(["protoc", f"-I{PROTOS}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                        str(PROTOS / "reasoning.proto")]) != 0:
            raise SystemExit(f"protoc failed on {PROTOS / 'reasoning.proto'}")
        modules = _import(tmp)
        sys.path.remove(tmp)
        return modules


def _import(folder: str) -> tuple:
    for name in ("reasoning_pb2.py", "reasoning_pb2_grpc.py"):  # else a ModuleNotFoundError traceback
        if not (Path(folder) / name).is_file():
            raise SystemExit(f"--stubs {folder}: no {name} there (generate it: {GENERATE})")
    sys.path.insert(0, folder)
    return importlib.import_module("reasoning_pb2"), importlib.import_module("reasoning_pb2_grpc")


def capacity(text: str) -> int:
    """C as the request's uint32 field takes it; 0 is left to the server, which refuses it by name."""
    try:
        c = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 0 <= c <= UINT32:
        raise argparse.ArgumentTypeError(f"{c} is outside 0..{UINT32}")
    return c


def channel(address: str, ca: str, server_name: str) -> grpc.Channel:
    """Plaintext, or TLS verified with the CA ``ca``: ``server_name`` is the host its certificate names,
    where ``address`` reaches the proxy by another name or an IP."""
    if not ca:
        return grpc.insecure_channel(address)
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(Path(ca).read_bytes()), options=options)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("problem", help="the problem text, as a user wrote it (the server formats it)")
    p.add_argument("--address", default="127.0.0.1:9000", help="host:port of Gambit's gRPC endpoint "
                   "(default: 127.0.0.1:9000, where `gambit serve` listens)")
    p.add_argument("--application", default="gambit", help="Ray Serve application the proxy routes to, "
                   "sent as the `application` metadata (default: gambit)")
    p.add_argument("--stubs", default="", help="folder with the generated stubs (\"\": generate them now)")
    p.add_argument("--capacity", type=capacity, default=8, help="C: traces in the pool, a count "
                   "(default: 8)")
    p.add_argument("--method", default="gambit", help="search method: gambit | sc | step | deepconf "
                   "(default: gambit)")
    p.add_argument("--tls-ca", default="", help="PEM CA file of a TLS proxy in front (\"\": plaintext)")
    p.add_argument("--tls-server-name", default="", help="the host the proxy's certificate names, where "
                   "--address is an IP or another name (\"\": --address's host)")
    args = p.parse_args(argv)
    if args.tls_ca and not Path(args.tls_ca).is_file():
        p.error(f"--tls-ca {args.tls_ca}: no such file")
    if args.tls_server_name and not args.tls_ca:
        p.error("--tls-server-name: needs --tls-ca (it names the host of a TLS server)")
    pb2, pb2_grpc = stubs(args.stubs)
    metadata = [("application", args.application)]
    if os.environ.get("GAMBIT_TOKEN"):
        metadata.append(("authorization", f"Bearer {os.environ['GAMBIT_TOKEN']}"))
    request = pb2.SolveRequest(problem=args.problem, method=args.method, capacity=args.capacity)
    with channel(args.address, args.tls_ca, args.tls_server_name) as ch:
        stub = pb2_grpc.ReasoningServiceStub(ch)
        try:
            for event in stub.Solve(request, metadata=metadata, timeout=300):
                kind = event.WhichOneof("event")
                if kind == "started":
                    s = event.started.settings  # what the run uses: the server's defaults filled in
                    print(f"run {event.started.run_id} on {event.started.replica}: {s.method}, "
                          f"C={s.capacity} K={s.swap}, {s.max_tokens} tokens a trace at most")
                elif kind == "progress":
                    g = event.progress
                    lead = max(g.votes, key=lambda v: v.weight, default=None)  # the answer so far
                    print(f"round {g.round}: {g.active} active, {g.ghost} ghost, {g.tokens} tokens"
                          + (f"; leading {lead.answer!r} ({lead.weight:g} of {g.finished})" if lead else ""))
                else:
                    r = event.result
                    votes = ", ".join(f"{v.answer}: {v.weight:g}" for v in r.majority_votes)
                    print(f"{r.status}: answer {r.answer!r} (votes {votes}; {r.generated_tokens} tokens)")
                    print(f"solution: {' | '.join(x for x in r.solution.splitlines() if x.strip())}")
                    return 0 if r.status == "done" else 1
        except grpc.RpcError as e:
            # nothing listens there (not a server that answered UNAVAILABLE: Redis down, stopping)
            hint = (" (no server at --address: start `gambit serve`, port 9000 by default)"
                    if "failed to connect" in (e.details() or "").lower() else "")
            print(f"{e.code().name}: {e.details()}{hint}", file=sys.stderr)
            return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
