"""``gambit client solve`` against a server that is not there: a clear error, exit code 1."""

import re

import pytest

from gambit.cli import main


def test_client_solve_reports_unreachable_server(capsys):
    assert main(["client", "solve", "Compute 1+2.", "--address", "127.0.0.1:1", "--capacity", "2"]) == 1
    err = capsys.readouterr().err
    assert "error: UNAVAILABLE" in err and "no server answers at 127.0.0.1:1: `gambit serve`" in err


@pytest.mark.parametrize("flags, message", [
    (["--address", "127.0.0.1:99999"], "address: port 99999 is not a TCP port"),
    (["--tls-ca", "/nonexistent.pem"], "--tls-ca: file /nonexistent.pem does not exist"),
])
def test_client_refuses_an_address_or_ca_it_cannot_use(flags, message):
    """gRPC dialled 127.0.0.1:99999 as port 34463; a missing CA file was "[Errno 2] No such file"."""
    with pytest.raises(SystemExit, match=message):
        main(["client", "solve", "Compute 1+2.", *flags])


def test_client_solve_request_fields():
    from gambit.serving.client import ClientConfig, solve_request
    from gambit.serving.protos import load

    pb2, _ = load("reasoning")
    req = solve_request(pb2, "p", ClientConfig(capacity=0, swap=-1, method="sc"))
    assert req.HasField("capacity") and req.capacity == 0 and not req.HasField("swap") and req.method == "sc"
    assert not solve_request(pb2, "p", ClientConfig()).HasField("capacity")


@pytest.mark.parametrize("flag, value", [("--round-interval", "-3"), ("--seed", "-1"), ("--top-k", "-5"),
                                         ("--capacity", "-2"), ("--max-tokens", str(2**32))])
def test_client_refuses_what_the_request_cannot_carry_naming_the_field(flag, value, capsys):
    """Negative values of unsigned fields failed with protobuf's "Value out of range" (or, for top_k,
    silently meant the server default); now the client names the field before calling anyone."""
    with pytest.raises(SystemExit, match=f"^gambit client solve: error: {flag}: must be in"):
        main(["client", "solve", "Compute 1+2.", "--address", "127.0.0.1:1", flag, value])


def test_client_solve_reads_a_problem_from_stdin(monkeypatch):
    """``gambit client solve -``: a multi-line problem piped in, sent whole, with the new request fields."""
    import io

    import gambit.serving.client as client
    from gambit.serving.protos import load

    sent = {}
    monkeypatch.setattr(client, "solve", lambda problem, cfg: sent.update(problem=problem, cfg=cfg) or 0)
    monkeypatch.setattr("sys.stdin", io.StringIO("Natalia sold clips to 48 friends.\nHow many in all?\n"))
    assert main(["client", "solve", "-", "--answer-rule", "gsm8k", "--max-total-tokens", "500",
                 "--run-id", "order-17"]) == 0
    assert sent["problem"] == "Natalia sold clips to 48 friends.\nHow many in all?\n"
    req = client.solve_request(load("reasoning")[0], sent["problem"], sent["cfg"])
    assert req.answer_rule == "gsm8k" and req.max_total_tokens == 500 and req.run_id == "order-17"


def test_client_result_without_an_answer_says_which_rule_read_it():
    """SmolLM2 asked a GSM8K question seldom boxes: the result said ``answer -`` and ``votes:`` with
    nothing after, leaving the user to guess why; now it names the rule and the one that reads it."""
    import io

    from gambit.serving.client import _print_result
    from gambit.serving.protos import load

    pb2, _ = load("reasoning")
    out = io.StringIO()
    _print_result(pb2.Result(status="done", generated_tokens=800, rounds=12), out)
    assert "no trace gave an answer under the 'boxed' rule (--answer-rule gsm8k" in out.getvalue()
    out = io.StringIO()
    _print_result(pb2.Result(status="done"), out, "gsm8k")
    assert "under the 'gsm8k' rule;" in out.getvalue() and "votes: none" in out.getvalue()
    out = io.StringIO()  # every trace cut at its token limit (TraceSummary.end_reason): said, with how many
    _print_result(pb2.Result(status="done", traces=[pb2.TraceSummary(end_reason="length"),
                                                    pb2.TraceSummary(end_reason="eos")]), out)
    assert "1 of 2 traces were cut at their --max-tokens" in out.getvalue()
    out = io.StringIO()  # a run stopped by its time limit says so (Result.message was never printed)
    _print_result(pb2.Result(status="limit", message="time limit 0.01 s reached"), out)
    assert "limit: time limit 0.01 s reached" in out.getvalue() and "no trace gave" not in out.getvalue()
    out = io.StringIO()
    _print_result(pb2.Result(status="done", answer="48", majority_votes=[pb2.Vote(answer="48", weight=2)]),
                  out)
    assert "no trace gave" not in out.getvalue() and "votes: 48:2" in out.getvalue()


def test_ctrl_c_during_a_solve_is_one_line_naming_the_run(monkeypatch, capsys):
    """Ctrl-C printed a 20-line KeyboardInterrupt traceback; one line now, with the run it cancelled."""
    import sys

    from gambit.serving import client
    from gambit.serving.protos import load

    pb2, _ = load("reasoning")

    class Stub:
        def Solve(self, request, metadata=()):  # noqa: N802 — the RPC's name
            yield pb2.SolveEvent(started=pb2.RunStarted(run_id="r9", replica="rep"))
            raise KeyboardInterrupt

    monkeypatch.setattr(client, "_call", lambda cfg, body, out, *_: body(pb2, Stub(), out or sys.stdout))
    assert main(["client", "solve", "Compute 1+2."]) == 130
    captured = capsys.readouterr()
    assert "run r9 on replica rep" in captured.out
    assert captured.err.strip() == ("interrupted: run r9 cancelled (the stream closed); "
                                    "`gambit client get r9` reads it")


@pytest.mark.parametrize("argv, stdin, said", [
    (["client", "solve", "Compute \udcff1+1."], "", "problem: not UTF-8 text (byte 0xff at character 8)"),
    (["client", "solve", "-"], "Compute \udcfe1+1.", "problem -: not UTF-8 text (byte 0xfe at character 8)"),
    (["client", "solve", "--run-id", "ab\udcff", "Compute 1+1."], "", "--run-id: not UTF-8 text"),
    (["client", "get", "ab\udcff"], "", "run_id: not UTF-8 text (byte 0xff at character 2)"),
    (["client", "cancel", "ab\udcff"], "", "run_id: not UTF-8 text (byte 0xff at character 2)"),
])
def test_client_text_that_is_not_utf8_is_refused_naming_it(argv, stdin, said, monkeypatch):
    """A non-UTF-8 argument or pipe arrives as surrogates (surrogateescape): protobuf's "'utf-8' codec can't
    encode character '\\udcff' in position 8" named no field (stop 70)."""
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit, match=f"error: {re.escape(said)}"):
        main([*argv, "--address", "127.0.0.1:1"])
