"""The YAML/CLI surface's edges: a config file's keys are the command's own flags, a bad file is one line
naming it, and each value a command reads late (a cache folder, a scorer spec, a vLLM python) is refused
under its flag before the work. Parse-only: nothing loads a model or trains."""

from __future__ import annotations

import pytest

from gambit.cli import build_parser, main
from gambit.config_cli import from_args


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def _from_yaml(parser, argv: list[str], cls, text: str, tmp_path, capsys) -> str:
    """``from_args`` on ``argv`` with ``--config`` a file holding ``text``: its one error line."""
    cfg = tmp_path / "c.yaml"
    cfg.write_bytes(text.encode("latin-1"))
    with pytest.raises(SystemExit) as e:
        from_args(cls, parser.parse_args([*argv, "--config", str(cfg)]))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err.strip()


def _cls(name: str):
    from gambit.bench.eval import EvalConfig
    from gambit.ops.cluster import ClusterConfig
    from gambit.serving.client import ClientConfig
    from gambit.serving.scorer_server import ScorerServerConfig

    return {"cluster": ClusterConfig, "client": ClientConfig, "scorer": ScorerServerConfig,
            "eval": EvalConfig}[name]


@pytest.mark.parametrize("argv, text", [
    (["cluster", "status"], "timeout_s: 5\n"),  # taken, and status never waits
    (["client", "solve", "x"], "rpc_timeout_s: 5\n"),  # taken, and a Solve stream has no RPC deadline
    (["scorer", "serve"], "tls: x\n"),  # "ScorerServerConfig.__init__() got an unexpected keyword argument"
])
def test_a_yaml_key_the_command_has_no_flag_for_is_refused(parser, tmp_path, capsys, argv, text):
    key = text.split(":")[0]
    said = _from_yaml(parser, argv, _cls(argv[0]), text, tmp_path, capsys)
    assert f"unknown options ['{key}'] ({key}: no option of gambit {' '.join(argv[:2])})" in said, said


@pytest.mark.parametrize("text, said", [
    ("samples: 4\n  bad indent: [\n", "c.yaml: malformed YAML at line 2, column 13: mapping values are not "
                                      "allowed here"),  # PyYAML's two lines, the file named twice
    ("\xff\xfe samples: 2\n", "c.yaml: not UTF-8 text (byte 0)"),  # "'utf-8' codec can't decode ..."
])
def test_a_bad_config_file_is_one_line_naming_it(parser, tmp_path, capsys, text, said):
    err = _from_yaml(parser, ["eval"], _cls("eval"), text, tmp_path, capsys)
    assert err.startswith("gambit eval: error: ") and said in err, err


def test_a_config_folder_is_a_clear_error(parser, tmp_path, capsys):
    """An IsADirectoryError escaped from_args: "gambit run: error: [Errno 21] Is a directory: '...'"."""
    with pytest.raises(SystemExit) as e:
        from_args(_cls("eval"), parser.parse_args(["eval", "--config", str(tmp_path)]))
    assert e.value.code == 2 and f"config file {tmp_path}: cannot read it (Is a directory)" in str(e.value)


def test_config_help_says_the_keys_and_that_a_flag_wins(parser):
    text = " ".join(parser._subparsers._group_actions[0].choices["run"].format_help().split())
    assert "keyed by their names with underscores (max_tokens: 200); a flag given as well wins" in text


def test_run_names_the_ops_range_as_flags(capsys):
    """`gambit eval` said "need 1 <= --min-ops <= --max-ops"; `gambit run` said the fields, "min_ops"."""
    with pytest.raises(SystemExit) as e:
        main(["run", "--min-ops", "9", "--save", "", "--png", ""])
    assert e.value.code == 2
    assert str(e.value) == "gambit run: error: need 1 <= --min-ops <= --max-ops, got 9, 8"


@pytest.mark.parametrize("what, module, func", [("drafter", "gambit.train.drafter", "train_drafter"),
                                                 ("scorer", "gambit.scoring.train", "train_scorer")])
@pytest.mark.parametrize("where", ["/proc/gambit-cache", "{tmp}/file"])
def test_an_unwritable_cache_dir_is_refused_before_the_data(monkeypatch, tmp_path, capsys, what, module,
                                                            func, where):
    """The drafter's data (1536 traces) was generated, then its save failed: "[Errno 2] No such file or
    directory: '/proc/x'"; the scorer's first rollout chunk likewise."""
    import importlib

    def started(*a, **k):
        raise AssertionError("the training started")

    monkeypatch.setattr(importlib.import_module(module), func, started)
    (tmp_path / "file").write_text("")
    cache = where.format(tmp=tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["train", what, "--out", str(tmp_path / "out"), "--cache-dir", cache])
    assert e.value.code == 2 and str(e.value).startswith(f"gambit train {what}: error: --cache-dir: {cache}")


def test_an_existing_or_creatable_cache_dir_passes(tmp_path):
    from gambit.paths import check_cache_dir

    check_cache_dir(str(tmp_path))
    check_cache_dir(str(tmp_path / "new" / "deeper"))
    assert not (tmp_path / "new").exists()  # nothing made


@pytest.mark.parametrize("flag", ["--scorer", "--scorer-mlp", "--scorer-sequence"])
def test_bench_search_names_the_scorer_flag_before_the_model_loads(monkeypatch, capsys, flag):
    """--scorer-mlp foo said "scorer 'foo': ...", after the target loaded: which of the three flags?"""
    import gambit.bench.search as search

    def started(*a, **k):
        raise AssertionError("the bench started")

    monkeypatch.setattr(search, "run_bench", started)
    with pytest.raises(SystemExit) as e:
        main(["bench", "search", flag, "foo"])
    assert e.value.code == 2
    assert str(e.value).startswith(f"gambit bench search: error: {flag} 'foo': no scorer")


def test_bench_engine_refuses_a_missing_vllm_python(tmp_path):
    """It ran every other backend (minutes), then noted "vLLM not measured: ... is missing"."""
    from gambit.bench.engine_args import parse_args

    missing = str(tmp_path / "python")
    with pytest.raises(ValueError, match=f"--vllm-python {missing}: no such file"):
        parse_args(["--vllm-python", missing])
    assert parse_args(["--vllm-python", missing, "--no-vllm"]).no_vllm  # not read: no refusal
