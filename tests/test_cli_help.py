"""What a newcomer meets first: each subcommand's ``--help`` says what the command does and what each flag
is, and a mistyped flag is refused by its own subcommand with the flag it most likely meant."""

from __future__ import annotations

import argparse
import re

import pytest

from gambit.cli import OWN_PARSERS, build_parser, main


def subcommands(parser: argparse.ArgumentParser, name: str = "gambit"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, sub in action.choices.items():
                yield f"{name} {word}", sub
                yield from subcommands(sub, f"{name} {word}")


def test_every_subcommand_says_what_it_does_and_every_flag_what_it_is():
    """`gambit run --help` opened with the usage and the flags, nothing on what the command does."""
    missing, bare = [], []
    for name, sub in subcommands(build_parser()):
        if not sub.description:
            missing.append(name)
        bare += [f"{name} {a.option_strings[0]}" for a in sub._actions
                 if a.option_strings and a.dest != "help" and not (a.help or "").strip()]
    assert not missing and not bare, (missing, bare)


def test_run_help_opens_with_what_it_does(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    head = out.split("options:")[0]
    assert "solves held-out problems, benchmark questions or a --question" in " ".join(head.split())


@pytest.mark.parametrize("argv, said", [
    (["run", "--modle", "smollm2"],
     "gambit run: error: unrecognized arguments: --modle smollm2 (--modle: did you mean --model?)"),
    (["run", "--top_p", "0.9"], "gambit run: error: unrecognized arguments: --top_p 0.9 (--top_p: did you "
                                "mean --top-p?)"),
    (["train", "drafter", "--metod=pr"],
     "gambit train drafter: error: unrecognized arguments: --metod=pr (--metod: did you mean --method?)"),
    (["inspect", "p1", "p2"], "gambit inspect: error: unrecognized arguments: p2"),
])
def test_a_mistyped_flag_is_refused_by_its_subcommand_with_the_likely_one(capsys, argv, said):
    """argparse said "gambit: error: unrecognized arguments: --modle smollm2" under the top level's usage,
    which lists none of `gambit run`'s flags."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.strip().endswith(said), err
    assert err.startswith(f"usage: gambit {argv[0]}") and "Traceback" not in err


def _help(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv", [["bench", name] for name in OWN_PARSERS])
def test_bench_help_shows_list_defaults_as_typed(argv, capsys):
    """`gambit bench engine --help` said "(default: ('defaults', 'float32'))" and "(default [1, 16, 64,
    256])": a Python tuple and list, not what the flag takes."""
    text = _help(argv, capsys)
    assert not re.search(r"default:? [(\[]['\d]", text), text
    if argv[1] == "engine":
        assert "(default: defaults,float32)" in text and "(default 1,16,64,256; 1,16,64 with --quick)" in text


def test_each_flags_help_stands_alone():
    """`train scorer`'s --repro-problems said "... trains on this many problems ..." and --repro-epochs
    "... for this many epochs": one sentence split over two flags."""
    split = [f"{name} {a.option_strings[0]}" for name, sub in subcommands(build_parser())
             for a in sub._actions if a.help and re.search(r"^\s*(\.\.\.|…)|\s(\.\.\.|…)\s*$", a.help)]
    assert not split, split


def test_cluster_status_lists_only_the_flags_it_reads(capsys):
    """`gambit cluster status --help` listed --timeout-s / --poll-s, which only `cluster wait` reads."""
    status = _help(["cluster", "status"], capsys)
    assert "--kubeconfig" in status and "--timeout-s" not in status and "--poll-s" not in status
    assert "--timeout-s" in _help(["cluster", "wait"], capsys)
    with pytest.raises(SystemExit) as e:
        main(["cluster", "status", "--timeout-s", "5"])
    assert e.value.code == 2 and "unrecognized arguments: --timeout-s 5" in capsys.readouterr().err


@pytest.mark.parametrize("argv, line", [
    (["run", "--top-p", "2"], "gambit run: error: --top-p must be in (0.0, 1.0], got 2.0"),
    (["eval", "--samples", "0"], "gambit eval: error: --samples must be >= 1, got 0"),
    (["eval", "--min-ops", "5", "--max-ops", "3"],
     "gambit eval: error: need 1 <= --min-ops <= --max-ops, got 5, 3"),
    (["train", "target", "--steps", "0"], "gambit train target: error: --steps must be >= 1, got 0"),
    (["train", "drafter", "--method", "x"], "gambit train drafter: error: --method must be one of"),
    (["train", "scorer", "--max-epochs", "0"],
     "gambit train scorer: error: --max-epochs must be >= 1, got 0"),
    (["bench", "search", "--capacity", "2"], "gambit bench search: error: --capacity must be >= 4, got 2"),
])
def test_run_eval_and_train_name_the_flag_and_exit_2_as_the_benches_do(argv, line, capsys):
    """run, eval and train said "error: top_p must be in (0.0, 1.0]" (the field, not the flag) and exit 1,
    where the bench commands said "error: --capacity ..." and exit 2."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith(line), err
