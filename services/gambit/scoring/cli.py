"""``gambit train scorer``: the command's parser and body (kept here so cli.py stays small)."""

from __future__ import annotations

import json
from pathlib import Path

from gambit.config_cli import add_dataclass_args, flag_checked, from_args
from gambit.paths import check_cache_dir, check_output, check_output_dir, say_if_overwriting
from gambit.scoring.train import TrainScorerConfig


def add_train_scorer_parser(sub, func) -> None:
    p = sub.add_parser("scorer", help="a boundary scorer (mlp | sequence) from rollouts of the target")
    add_dataclass_args(p, TrainScorerConfig)
    p.add_argument("--json", help="also write the held-out evaluation JSON here")
    p.set_defaults(func=func)


def train_scorer_command(args) -> int:
    from gambit.scoring.card import write_card
    from gambit.scoring.evaluate import format_table
    from gambit.scoring.train import train_scorer

    cfg = from_args(TrainScorerConfig, args)
    flag_checked(args, check_output_dir, cfg.out, "--out")  # train_scorer's check, as a flag
    flag_checked(args, check_output, args.json or "", "--json")  # before the rollouts and training
    flag_checked(args, check_cache_dir, cfg.cache_dir, "--cache-dir")  # not after the first rollout chunk
    say_if_overwriting(cfg.out)
    info = train_scorer(cfg)
    d = info["data"]
    print(f"{cfg.kind} scorer ({info['params']} parameters): {d['fit_boundaries']} fit boundaries of "
          f"{d['fit_problems']} problems, {d['val_boundaries']} validation boundaries of "
          f"{d['val_problems']} problems; best epoch {d['best_epoch']} of {len(info['loss_history'])}; "
          f"saved to {cfg.out}")
    print(f"held-out: {info['heldout']['problems']} dev-split problems, {info['heldout']['traces']} traces")
    print(format_table(info["heldout"]))
    print(f"model card: {write_card(cfg.out)}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(info["heldout"], indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0
