"""The synthetic arithmetic task: splits, determinism, solution format, checking, difficulty."""

from __future__ import annotations

import hashlib
import pickle
import random
import re
import statistics
from itertools import islice

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gambit.model import build_char_tokenizer
from gambit.tasks.arithmetic import (
    MAX_VALUE,
    SPLITS,
    THOUGHT_SEP,
    Problem,
    TaskConfig,
    TooFewProblems,
    check_answer,
    check_thought,
    format_step,
    generate,
    make_problem,
    split_of,
)
from gambit.train.target import TrainTargetConfig, batches

PROMPT_RE = re.compile(r"Compute (?P<expr>[0-9+\-*()]+)\.\nSolution:\n", re.S)


def assert_well_formed(p: Problem) -> None:
    """Every property a generated problem must have."""
    thoughts = p.solution.split(THOUGHT_SEP)
    assert len(thoughts) == p.n_ops + 1
    for t in thoughts[:-1]:
        assert check_thought(t) is True, t
    assert thoughts[-1] == f"\\boxed{{{p.answer}}}"
    assert check_answer(p.solution, p.answer)
    # Python precedence with the written parentheses equals the left-to-right chain
    assert eval(p.expr, {"__builtins__": {}}, {}) == p.answer
    flat = p.expr.replace("(", "").replace(")", "")
    nums = [int(x) for x in re.findall(r"\d+", flat)]
    ops = re.findall(r"[+\-*]", flat)
    assert nums[0] == p.steps[0][0] and 2 <= nums[0] <= 99
    assert [(o, b) for o, b in zip(ops, nums[1:], strict=True)] == [(s[1], s[2]) for s in p.steps]
    assert all(p.expr[i + 1] == "*" for i, ch in enumerate(p.expr) if ch == ")")  # parens only before *
    value = p.steps[0][0]
    for a, op, b, result in p.steps:
        assert a == value
        assert result == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert 0 <= result <= MAX_VALUE
        value = result
    assert value == p.answer
    assert p.prompt == f"Compute {p.expr}.\nSolution:\n"
    assert p.to_dict() == {"prompt": p.prompt, "answer": str(p.answer), "solution": p.solution,
                           "n_ops": p.n_ops}


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), n_ops=st.integers(1, 24))
def test_make_problem_properties(seed, n_ops):
    p = make_problem(random.Random(seed), n_ops)
    assert p.n_ops == n_ops
    assert_well_formed(p)


@settings(max_examples=25, deadline=None)
@given(split=st.sampled_from(SPLITS), seed=st.integers(0, 10**9), n=st.integers(1, 12),
       ops=st.tuples(st.integers(1, 8), st.integers(0, 8)))
def test_generate_deterministic_distinct_in_split(split, seed, n, ops):
    config = TaskConfig(ops[0], ops[0] + ops[1])
    problems = generate(split, n, seed, config)
    assert problems == generate(split, n, seed, config)
    assert len(problems) == n
    assert len({p.expr for p in problems}) == n
    for p in problems:
        assert p.split == split == split_of(p.expr)
        assert config.min_ops <= p.n_ops <= config.max_ops
        assert_well_formed(p)


def test_seed_and_split_change_the_problems():
    a = generate("train", 20, 0)
    assert [p.expr for p in a] != [p.expr for p in generate("train", 20, 1)]
    assert generate("train", 5, 0) == a[:5]  # a prefix of the same stream


def test_split_of_fixed_hash_and_proportions():
    """The split is a function of the problem text alone (sha256), whatever the seed."""
    rng = random.Random(7)
    exprs = {make_problem(rng, rng.randint(1, 10)).expr for _ in range(3000)}
    counts = dict.fromkeys(SPLITS, 0)
    for e in exprs:
        h = int.from_bytes(hashlib.sha256(e.encode()).digest()[:4], "big") % 100
        want = "train" if h < 80 else "dev" if h < 90 else "test"
        assert split_of(e) == want
        counts[split_of(e)] += 1
    n = len(exprs)
    assert abs(counts["train"] / n - 0.8) < 0.03
    assert abs(counts["dev"] / n - 0.1) < 0.03
    assert abs(counts["test"] / n - 0.1) < 0.03


def test_splits_are_disjoint():
    sets = {s: {p.expr for p in generate(s, 150, 0, TaskConfig(1, 4))} for s in SPLITS}
    assert not sets["train"] & sets["test"]
    assert not sets["train"] & sets["dev"]
    assert not sets["dev"] & sets["test"]


def test_training_batches_hold_only_train_problems():
    tok = build_char_tokenizer()
    cfg = TrainTargetConfig(batch_size=4, min_ops=1, max_ops=4)
    test_exprs = {p.expr for p in generate("test", 300, 0, TaskConfig(1, 4))}
    seen = 0
    for ids, mask in islice(batches(cfg, tok, random.Random(0), group=3), 6):
        assert ids.shape[0] == cfg.batch_size and mask.shape == ids.shape
        for row, m in zip(ids.tolist(), mask.tolist(), strict=True):
            text = tok.decode(row)
            match = PROMPT_RE.match(text)
            assert match, text
            expr = match["expr"]
            assert split_of(expr) == "train" and expr not in test_exprs
            solution = text[match.end():]
            n_prompt = len(tok.encode(match.group(0)))
            assert row[0] == tok.bos_id and not any(m[:n_prompt]) and m[n_prompt]
            target = [t for t, keep in zip(row, m, strict=True) if keep]
            assert target == tok.encode(solution, add_bos=False) + tok.eos_ids[:1]  # loss on solution + eos
            assert all(t == tok.pad_id for t in row[n_prompt + len(target):])
            thoughts = solution.split(THOUGHT_SEP)
            assert all(check_thought(t) for t in thoughts[:-1])
            assert check_answer(thoughts[-1], eval(expr, {"__builtins__": {}}, {}))
            seen += 1
    assert seen == 24


def test_difficulty_knob_token_counts():
    """2 ops need ~25-40 tokens of reasoning, 20 ops about 200 (char tokenizer)."""
    tok = build_char_tokenizer()
    rng = random.Random(0)

    def lengths(n_ops):
        return [len(tok.encode(make_problem(rng, n_ops).solution, add_bos=False)) for _ in range(150)]

    two, ten, twenty = lengths(2), lengths(10), lengths(20)
    assert 20 <= statistics.mean(two) <= 50
    assert statistics.mean(two) < statistics.mean(ten) < statistics.mean(twenty)
    assert statistics.mean(twenty) >= 200
    assert statistics.median(twenty) >= 200
    assert min(twenty) >= 20 * 7  # every one of the 20 thoughts is several tokens


@pytest.mark.parametrize("step,text", [
    ((374, "*", 2, 748), "374*2=300*2+70*2+4*2=600+140+8=748"),
    ((305, "*", 3, 915), "305*3=300*3+5*3=900+15=915"),
    ((300, "*", 2, 600), "300*2=600"),
    ((7, "*", 5, 35), "7*5=35"),
    ((12, "+", 30, 42), "12+30=42"),
    ((50, "-", 50, 0), "50-50=0"),
])
def test_format_step_spelled(step, text):
    assert format_step(*step, spell=True) == text
    assert check_thought(text) is True


@pytest.mark.parametrize("step,text", [
    ((374, "*", 2, 748), "374*2=748"),
    ((7, "*", 5, 35), "7*5=35"),
    ((12, "+", 30, 42), "12+30=42"),
])
def test_format_step_direct(step, text):
    assert format_step(*step) == text
    assert check_thought(text) is True


def test_spelled_problems_keep_the_flag():
    p = make_problem(random.Random(3), 6, spell_products=True)
    assert p.spell_products and all(check_thought(t) for t in p.solution.split("\n\n")[:-1])
    assert generate("test", 3, 0, TaskConfig(2, 4, spell_products=True))[0].spell_products


@pytest.mark.parametrize("completion,answer,ok", [
    ("12+30=42\n\n\\boxed{42}", 42, True),
    ("\\boxed{42}", "42", True),
    ("\\boxed{ 42 }", 42, True),
    ("\\boxed{1,234}", 1234, True),
    ("\\boxed{41}", 42, False),
    ("the answer is 42", 42, False),
    ("\\boxed{}", 42, False),
    ("\\boxed{42", 42, False),
    ("\\boxed{41}\n\n\\boxed{42}", 42, True),  # the last box counts
    ("\\boxed{42}\n\n\\boxed{41}", 42, False),
    ("\\boxed{forty-two}", 42, False),
])
def test_check_answer(completion, answer, ok):
    assert check_answer(completion, answer) is ok


@pytest.mark.parametrize("thought,want", [
    ("12+30=42", True),
    ("3-5=-2", True),
    ("12+30=43", False),
    ("374*2=300*2+70*2+4*2=600+140+8=748", True),
    ("374*2=300*2+70*2+4*2=600+140+9=748", False),  # wrong in the middle
    ("374*2=300*2+70*2+4*2=600+140+8=749", False),
    ("\\boxed{42}", None),
    ("hello", None),
    ("12+30=", None),
    ("=42", None),
    ("12+=42", None),
    ("x+1=2", None),
    ("2**3=8", None),
    ("9**9**9**9=1", None),  # returns at once instead of computing a gigantic power
    ("1" * 5000 + "=1", None),
])
def test_check_thought(thought, want):
    assert check_thought(thought) is want


@pytest.mark.parametrize("lo,hi", [(0, 3), (-1, 2), (5, 4)])
def test_task_config_validation(lo, hi):
    with pytest.raises(ValueError, match="min_ops"):
        TaskConfig(lo, hi)


def test_bad_arguments():
    TaskConfig(1, 1)
    with pytest.raises(ValueError, match="split"):
        generate("validation", 1, 0)
    with pytest.raises(ValueError, match="n_ops"):
        make_problem(random.Random(0), 0)


def test_the_question_is_the_prompt_without_the_cue():
    """``Problem.question`` is what a backend sends; the served Target's task format turns it back into
    the prompt the shipped target learnt, exactly."""
    from gambit.serving.prompt_format import task_prompt

    for p in generate("test", 20, 1):
        assert task_prompt(p.question) == p.prompt and p.question.startswith("Compute ")


def test_asking_for_more_problems_than_a_range_holds_is_refused_not_a_hang():
    """One operation gives ~1.6k distinct test problems: 2000 looped forever at full CPU, printing nothing."""
    with pytest.raises(ValueError, match=r"^only 1586 distinct test problems with 1-1 operations found .*"
                                         r"asked for 2000: lower the count to at most 1586, "
                                         r"or widen min_ops/max_ops$"):
        generate("test", 2000, 0, TaskConfig(1, 1))


def test_too_few_problems_survives_pickling():
    """Ray pickles a task's error: the default rebuilt it from its message alone, a TypeError."""
    err = TooFewProblems("test", 3, 10, TaskConfig(1, 1))
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), str(back), back.found, back.asked) == (TooFewProblems, str(err), 3, 10)
    assert back.said("--n") == err.said("--n")
