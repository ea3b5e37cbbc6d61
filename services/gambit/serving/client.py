"""A small ReasoningService client: ``gambit client solve "…"`` prints the stream, ``gambit client get
RUN`` a run's record, ``gambit client cancel RUN`` stops one."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import ClassVar

from gambit.serving.protos import load
from gambit.serving.security import auth_metadata, check_address, check_client_tls, open_channel, read_token


@dataclass
class ConnectConfig:
    """Where and how to call the ReasoningService."""

    FLAG_ERRORS: ClassVar[bool] = True  # gambit.config_cli: its errors name the flags, exit 2
    address: str = "127.0.0.1:9000"  # host:port of the gRPC endpoint
    application: str = "gambit"  # Ray Serve application (metadata "application"; "" for none)
    token_env: str = "GAMBIT_TOKEN"  # environment variable with the bearer token
    tls_ca: str = ""  # PEM CA to verify a TLS server: a TLS proxy in front ("" = plaintext, as Serve speaks)
    tls_cert: str = ""  # PEM client certificate, for a server that asks for one (mTLS; with --tls-key)
    tls_key: str = ""  # PEM private key of --tls-cert
    tls_server_name: str = ""  # the host its certificate names, where --address gives another name or an IP
    rpc_timeout_s: float = 30.0  # deadline of a GetRun / CancelRun call, seconds

    def __post_init__(self) -> None:
        if not self.rpc_timeout_s > 0:
            raise ValueError(f"rpc_timeout_s: must be > 0 seconds, got {self.rpc_timeout_s}")
        check_address(self.address)
        check_host_port(self.address)
        check_client_tls("tls_", self.tls_ca, self.tls_cert, self.tls_key, self.tls_server_name)


GRPC_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:")  # gRPC's own target forms


def check_host_port(address: str) -> None:
    """A plain ``--address`` with a port: gRPC read "" as no target ("UNKNOWN: Failed to create channel",
    exit 1), "localhost" as port 443 (no server there: `gambit serve` listens on 9000), and "host:90x"
    failed at the call; a gRPC target form (``dns:///h:p``, ``unix:/path``) is passed as it is."""
    if address.startswith(GRPC_SCHEMES):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address: expected host:port (e.g. 127.0.0.1:9000, [::1]:9000), got {address!r}")


@dataclass
class ClientConfig(ConnectConfig):
    """A Solve call: where, and the run's settings (unset ones take the server's defaults)."""

    method: str = ""  # gambit | sc | step | deepconf ("" = server default)
    decoding: str = ""  # plain | eagle3.1 | pr ("" = server default)
    capacity: int = -1  # C: traces in the run's pool (-1 = server default)
    swap: int = -1  # K: traces pruned and branched per round (-1 = server default)
    round_interval: int = 0  # Δ: decode steps between rounds (0 = server default)
    max_tokens: int = 0  # tokens per trace (0 = server default)
    max_total_tokens: int = 0  # tokens over the whole run, all traces (0 = server default: none)
    temperature: float = -1.0  # sampling temperature, >= 0 (-1 = server default)
    top_p: float = 0.0  # nucleus mass in (0, 1], 1 = no nucleus (0 = server default)
    top_k: int = -1  # top-k filter, 0 = none (-1 = server default)
    seed: int = 0  # run seed
    timeout_s: float = 0.0  # run time limit, seconds (0 = none)
    raw_prompt: bool = False  # send the problem to the model as it is (default: the Target formats it)
    answer_rule: str = ""  # how answers are read: boxed | integer | gsm8k | choice | latex ("" = boxed)
    run_id: str = ""  # the run's id, yours to choose ([A-Za-z0-9_-], <= 64 chars; "" = the server makes one)

    def __post_init__(self) -> None:
        """What the request's unsigned fields cannot carry is refused here, naming the field (protobuf
        would raise "Value out of range"); every other value goes to the server, which judges it."""
        super().__post_init__()
        for name, low in (("capacity", -1), ("swap", -1), ("top_k", -1), ("round_interval", 0),
                          ("max_tokens", 0), ("max_total_tokens", 0), ("seed", 0)):
            value = getattr(self, name)
            top = 2**64 - 1 if name == "seed" else 2**32 - 1
            if not low <= value <= top:
                unset = " (-1 = server default)" if low == -1 else ""
                raise ValueError(f"{name}: must be in [{low}, {top}]{unset}, got {value}")


def metadata(cfg: ConnectConfig):
    token = read_token(cfg.token_env)
    return auth_metadata(token) + ((("application", cfg.application),) if cfg.application else ())


def solve_request(pb2, problem: str, cfg: ClientConfig):
    req = pb2.SolveRequest(problem=problem, method=cfg.method, decoding=cfg.decoding,
                           round_interval=cfg.round_interval, max_tokens=cfg.max_tokens,
                           max_total_tokens=cfg.max_total_tokens, seed=cfg.seed,
                           timeout_s=cfg.timeout_s, raw_prompt=cfg.raw_prompt, answer_rule=cfg.answer_rule,
                           run_id=cfg.run_id)
    if cfg.capacity >= 0:
        req.capacity = cfg.capacity
    if cfg.swap >= 0:
        req.swap = cfg.swap
    if cfg.temperature != -1.0:  # any other value is sent, and a bad one is refused by the server
        req.temperature = cfg.temperature
    if cfg.top_p != 0.0:
        req.top_p = cfg.top_p
    if cfg.top_k >= 0:
        req.top_k = cfg.top_k
    return req


def _print_settings(s, out) -> None:
    """The settings a run uses (``RunStarted.settings``), the server's defaults filled in."""
    shown = (("top_p", s.top_p, 1.0), ("top_k", s.top_k, 0), ("timeout_s", s.timeout_s, 0.0),
             ("max_total_tokens", s.max_total_tokens, 0))  # each where it is not its "none"
    extra = [f"{name} {v:g}" for name, v, none in shown if v != none]
    print(f"settings: {s.method} {s.decoding}  C={s.capacity} K={s.swap} Δ={s.round_interval}  max_tokens "
          f"{s.max_tokens}  temperature {s.temperature:g}  seed {s.seed}  answer_rule {s.answer_rule}"
          + "".join(f"  {x}" for x in extra) + ("  raw_prompt" if s.raw_prompt else ""), file=out)


def _print_progress(p, out) -> None:
    votes = sorted(p.votes, key=lambda v: -v.weight)
    print(f"round {p.round:3d}  active {p.active:3d}  ghost {p.ghost:2d}  pruned {p.pruned:2d}  "
          f"branched {p.branched:2d}  tokens {p.tokens:6d}  kv {p.kv_usage:.3f}  {p.elapsed_s:.2f}s"
          + (f"  votes {', '.join(f'{v.answer} ×{v.weight:g}' for v in votes[:4])}" if votes else ""),
          file=out)


def _print_result(r, out, answer_rule: str = "") -> None:
    print(f"result: {r.status}  answer {r.answer or '-'}  "
          f"(majority {r.majority_answer or '-'}, weighted {r.weighted_answer or '-'})  "
          f"{r.generated_tokens} tokens, {r.rounds} rounds, "
          f"{r.timings.total_s:.2f}s (first event {r.timings.first_event_s:.3f}s, scorer "
          f"{r.timings.scorer_s:.3f}s, fallbacks {r.scorer_fallbacks})", file=out)
    votes = ", ".join(f"{v.answer}:{v.weight:g}" for v in r.majority_votes)
    print(f"votes: {votes or 'none'}", file=out)
    if r.message:  # why a run ended early (limit, cancelled, failed)
        print(f"{r.status}: {r.message}", file=out)
    if not r.answer and not r.majority_votes and r.status == "done":
        rule = answer_rule or "boxed"
        other = " (--answer-rule gsm8k reads the last number)" if rule == "boxed" else ""
        cut = sum(t.end_reason == "length" for t in r.traces)  # TraceSummary.end_reason: its token limit
        why = (f"; {cut} of {len(r.traces)} traces were cut at their --max-tokens" if cut
               else "; a trace also stops at its --max-tokens")
        print(f"no trace gave an answer under the {rule!r} rule{other}{why}", file=out)
    if r.solution:
        print(f"solution (trace {r.solution_trace}):", file=out)
        print("\n".join("  " + line for line in r.solution.rstrip().splitlines()), file=out)


def _call(cfg: ConnectConfig, body, out, command: str) -> int:
    """Run ``body(pb2, stub, out)`` on a channel to ``cfg.address``; a gRPC error is printed (code and
    details, after ``command``: "gambit client get: error: NOT_FOUND: ...") and gives exit code 1.
    ``out``: where body prints (None: the ``sys.stdout`` of the call, not of the import, so a redirected
    stdout gets it)."""
    import grpc

    pb2, g = load("reasoning")
    with open_channel(cfg.address, cfg.tls_ca, cfg.tls_cert, cfg.tls_key,
                      server_name=cfg.tls_server_name) as ch:
        try:
            body(pb2, g.ReasoningServiceStub(ch), out or sys.stdout)
        except grpc.RpcError as e:
            print(f"{command}: error: {e.code().name}: {e.details()}{_hint(e, cfg)}", file=sys.stderr)
            return 1
    return 0


def _hint(e, cfg: ConnectConfig) -> str:
    """Why a call found no server, read from gRPC's details: a TLS server closes a plaintext connection
    ("Socket closed"), which said "no server answers" of a server that had answered."""
    import grpc

    details = e.details() or ""
    if e.code() != grpc.StatusCode.UNAVAILABLE or "connect" not in details.lower():
        return ""
    where = f"\n(the server at {cfg.address}"
    if "WRONG_VERSION_NUMBER" in details and cfg.tls_ca:
        return f"{where} speaks plaintext, as `gambit serve` does: drop --tls-ca)"
    if "Hostname Verification" in details:
        return f"{where} has a certificate for another name: pass it as --tls-server-name)"
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return f"{where} has a certificate that --tls-ca {cfg.tls_ca} did not sign)"
    if "Socket closed" in details and not cfg.tls_ca:
        return (f"\n(no plaintext server answers at {cfg.address}: `gambit serve` starts one there; or it "
                "speaks TLS: pass --tls-ca, and --tls-cert/--tls-key if it asks for a client certificate)")
    if "Socket closed" in details:  # the handshake got as far as the server's check of the client
        why = "did not take --tls-cert (is it signed by the server's --tls-client-ca?)" if cfg.tls_cert \
            else "may ask for a client certificate: pass --tls-cert/--tls-key"
        return f"{where} closed the TLS connection: it {why})"
    return f"\n(no server answers at {cfg.address}: `gambit serve` starts one there)"


def solve(problem: str, cfg: ClientConfig, out=None) -> int:
    """Print each streamed event; returns 0 when the run ends with a result."""

    started: list[str] = []

    def body(pb2, stub, out) -> None:
        for ev in stub.Solve(solve_request(pb2, problem, cfg), metadata=metadata(cfg)):
            kind = ev.WhichOneof("event")
            if kind == "started":
                started.append(ev.started.run_id)
                again = " (resumed: its replica was lost)" if ev.started.resumed else ""
                print(f"run {ev.started.run_id} on replica {ev.started.replica}{again}", file=out)
                if ev.started.HasField("settings"):
                    _print_settings(ev.started.settings, out)
            elif kind == "progress":
                _print_progress(ev.progress, out)
            else:
                _print_result(ev.result, out, cfg.answer_rule)

    try:
        return _call(cfg, body, out, "gambit client solve")
    except KeyboardInterrupt:  # Ctrl-C: the stream closes, and the server cancels the run (frees its KV)
        run = f"run {started[-1]} cancelled (the stream closed); `gambit client get {started[-1]}` reads it" \
            if started else "no run started"
        print(f"interrupted: {run}", file=sys.stderr)
        return 130


def get_run(run_id: str, cfg: ConnectConfig, out=None) -> int:
    """``GetRun``: a run's status, its request, last round and result, from its record in Redis."""

    def body(pb2, stub, out) -> None:
        info = stub.GetRun(pb2.GetRunRequest(run_id=run_id), metadata=metadata(cfg),
                           timeout=cfg.rpc_timeout_s)
        req = info.request
        print(f"run {info.run_id}: {info.status}  replica {info.replica or '-'}  traces {info.num_traces}  "
              f"method {req.method or 'gambit'}  decoding {req.decoding or 'plain'}  seed {req.seed}",
              file=out)
        if req.problem:  # which run this is, at a glance (a long problem shortened)
            text = " ".join(req.problem.split())
            print(f"problem: {text if len(text) <= 160 else text[:159] + '…'}", file=out)
        if info.HasField("settings"):
            _print_settings(info.settings, out)
        if info.HasField("last_progress"):
            _print_progress(info.last_progress, out)
        if info.HasField("result"):
            _print_result(info.result, out, req.answer_rule)

    return _call(cfg, body, out, "gambit client get")


def cancel_run(run_id: str, cfg: ConnectConfig, out=None) -> int:
    """``CancelRun``: stop a run in flight and free its KV (its Solve stream ends "cancelled")."""

    def body(pb2, stub, out) -> None:
        r = stub.CancelRun(pb2.CancelRunRequest(run_id=run_id), metadata=metadata(cfg),
                           timeout=cfg.rpc_timeout_s)
        what = "cancelled" if r.cancelled else "not in flight"
        print(f"run {r.run_id}: {what} (status {r.status or '-'})", file=out)

    return _call(cfg, body, out, "gambit client cancel")
