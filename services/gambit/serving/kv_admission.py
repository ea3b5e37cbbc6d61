"""Whether a run fits a Target replica's KV: its worst case (C full-length traces, the prompt's full
blocks held once) beside the runs already admitted. A run that can never fit is a request error; one that
does not fit now is ``Overcommitted`` (RESOURCE_EXHAUSTED: retry later, or on another replica)."""

from __future__ import annotations

from gambit.engine.block_manager import shared_prompt_blocks
from gambit.search.config import check_batch
from gambit.serving.solve_config import SolveConfig


class Overcommitted(RuntimeError):
    """The run would overcommit the target's KV memory."""


def blocks_needed(engine, problem: str, cfg: SolveConfig) -> int:
    """KV blocks of C full-length traces; the prompt's full blocks are held once (the run's
    traces start from one prefill and share them, ``Engine.add_samples``). A prompt no run can
    take (characters the vocabulary lacks, no room for a token) is a ValueError naming ``problem``
    here, before the KV check: it was found only at submission, after it, so beside busy runs it
    was Overcommitted (RESOURCE_EXHAUSTED, "retry later"), which never helps."""
    n = len(engine.tokenizer.encode_checked(problem, "problem"))
    if n >= engine.max_model_len:  # the driver's rule (``SearchDriver.submit``)
        raise ValueError(f"problem: prompt has {n} tokens; the context holds {engine.max_model_len} "
                         "including at least one generated token")
    return shared_prompt_blocks(n, min(n + cfg.max_tokens, engine.max_model_len), cfg.capacity,
                                engine.blocks.block_size)


def check_fits(engine, cfg: SolveConfig, need: int, free: int, replica: str) -> None:
    """Raise unless a run of ``need`` blocks fits the ``free`` ones of ``replica``: ValueError when it
    never can (nor its C in the batch), ``Overcommitted`` when it does not now."""
    if need <= engine.num_blocks:  # (else the KV error below) a request error, never a retry
        check_batch(cfg.method, cfg.capacity, engine.config.max_num_seqs, "capacity: C")
    if need > free:
        cap = engine.max_model_len  # a trace ends there whatever max_tokens says
        tokens = (f"{cfg.max_tokens} tokens" if cfg.max_tokens < cap else f"max_tokens "
                  f"{cfg.max_tokens}, at most {cap} with the prompt: the model's length")
        if need > engine.num_blocks:  # never admitted: a request error, not a retry later
            raise ValueError(f"capacity: the run needs up to {need} KV blocks (capacity "
                             f"{cfg.capacity} x {tokens}), more than a Target replica holds "
                             f"({engine.num_blocks}); lower capacity or max_tokens")
        raise Overcommitted(f"run needs up to {need} KV blocks (capacity {cfg.capacity} x "
                            f"{tokens}); {free} of {engine.num_blocks} "
                            f"are free on replica {replica}")
