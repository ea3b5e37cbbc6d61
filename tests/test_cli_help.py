"""What a newcomer meets first: each subcommand's ``--help`` says what the command does and what each flag
is, and a mistyped flag is refused by its own subcommand with the flag it most likely meant."""

from __future__ import annotations

import argparse

import pytest

from gambit.cli import build_parser, main


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
