"""Score boundary hidden states with a running ScorerService (``gambit scorer serve``) from your own code.

    python examples/score_states.py --address 127.0.0.1:50061    # Gambit installed (.venv/bin/python)

Info says the width d and the confidence features F a row needs. A row is one thought boundary of one
trace: its hidden state (raw little-endian bytes + dtype + shape, ``encode_states``), F log-probabilities
<= 0 when F > 0, and a trace id ("run:trace"; a sequence scorer keeps each id's history until a drop).
Send ``authorization: Bearer $GAMBIT_TOKEN`` when the server has a token. A TLS server
(``--tls-cert/--tls-key``) takes ``--tls-ca`` here, and one that asks for client certificates
(``--tls-client-ca``) ``--tls-cert/--tls-key`` too.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
import torch

from gambit.serving.payload import encode_states
from gambit.serving.protos import load
from gambit.serving.security import check_client_tls, open_channel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--address", default="127.0.0.1:50061", help="host:port of the ScorerService "
                   "(default: 127.0.0.1:50061, where `gambit scorer serve` listens)")
    p.add_argument("--rows", type=int, default=3, help="boundaries to score (random states), a count in "
                   "1..100 (default: 3)")
    p.add_argument("--tls-ca", default="", help="PEM CA file of a TLS server (\"\": plaintext)")
    p.add_argument("--tls-cert", default="", help="PEM client certificate file (mTLS), with --tls-key "
                   "(\"\": none)")
    p.add_argument("--tls-key", default="", help="PEM private key file of --tls-cert (\"\": none)")
    p.add_argument("--tls-server-name", default="", help="the host the server's certificate names, where "
                   "--address is an IP or another name (\"\": --address's host)")
    args = p.parse_args(argv)
    if not 1 <= args.rows <= 100:
        p.error(f"--rows must be in 1..100, got {args.rows}")
    try:
        check_client_tls("tls_", args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name)
    except ValueError as e:
        p.error(str(e))
    pb2, pb2_grpc = load("scorer")
    token = os.environ.get("GAMBIT_TOKEN", "")
    metadata = [("authorization", f"Bearer {token}")] if token else []
    with open_channel(args.address, args.tls_ca, args.tls_cert, args.tls_key,
                      server_name=args.tls_server_name) as channel:
        stub = pb2_grpc.ScorerServiceStub(channel)
        try:
            info = stub.Info(pb2.InfoRequest(), metadata=metadata, timeout=10)
            states = torch.randn(args.rows, info.hidden_size, generator=torch.Generator().manual_seed(0))
            raw, dtype, shape = encode_states(states)
            ids = [f"demo:{i % 2}" for i in range(args.rows)]  # two traces, their boundaries in order
            features = [-0.1] * (args.rows * info.features)  # the target's sampled-token log-probabilities
            request = pb2.ScoreRequest(states=raw, dtype=dtype, shape=shape, trace_ids=ids, features=features,
                                       drops=sorted(set(ids)))  # the traces are done: the scorer forgets them
            reply = stub.Score(request, metadata=metadata, timeout=10)
        except grpc.RpcError as e:  # INVALID_ARGUMENT names the field; UNAUTHENTICATED: no or wrong token
            # nothing listens there (not a server that answered UNAVAILABLE: Redis down, stopping)
            hint = (" (no server at --address: start `gambit scorer serve`, port 50061 by default)"
                    if "failed to connect" in (e.details() or "").lower() else "")
            print(f"{e.code().name}: {e.details()}{hint}", file=sys.stderr)
            return 2
    print(f"{info.kind} scorer, d={info.hidden_size}, F={info.features}")
    for trace, score in zip(ids, reply.scores, strict=True):
        print(f"{trace}: {score:.6f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
