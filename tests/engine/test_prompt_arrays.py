"""Prompts given as numpy arrays, torch tensors or lists of numpy integers (a tokenizer's output)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_util import make_engine

from gambit.engine.sequence import SamplingParams

IDS = [3, 17, 42, 9, 5]
P = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.mark.parametrize("prompt", [np.array(IDS), torch.tensor(IDS), [np.int64(t) for t in IDS],
                                    np.array(IDS, dtype=np.int32)],
                         ids=["numpy", "torch", "numpy-ints", "int32"])
def test_integer_arrays_are_the_same_prompt(tiny, prompt):
    """They were refused as "prompt token ids must be integers": numpy's int64 is no ``int``."""
    engine = make_engine(tiny, num_blocks=16, block_size=4)
    assert engine.generate([prompt], P) == engine.generate([IDS], P)
    assert engine.blocks.num_free == 16


@pytest.mark.parametrize("prompt", [torch.tensor([True, False]), np.array([3.0, 4.0]), np.array(5),
                                    [np.bool_(True)], np.array([], dtype=np.int64)])
def test_other_arrays_are_refused_by_name(tiny, prompt):
    engine = make_engine(tiny, num_blocks=16, block_size=4)
    with pytest.raises(ValueError, match="prompt"):
        engine.add(prompt, P)
    assert not engine.traces and not engine.has_unfinished()
