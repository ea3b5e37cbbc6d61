"""Seeded multi-step arithmetic problems written as "\\n\\n"-separated thoughts.

A problem is a left-to-right chain such as ``(44+30)*5-6+97``; its solution has one thought per
operation and ends in ``\\boxed{N}``. Every intermediate stays in [0, 999]. The difficulty knob is
the number of operations: 2 ops need ~25 tokens of reasoning, 20 ops about 200. Products can be
spelled out by place value (``spell_products``); the shipped target uses the direct form, whose
errors are local and unbiased, so that voting over samples helps (see the model card).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from gambit.tasks.answers import check_integer, extract_boxed

THOUGHT_SEP = "\n\n"
PROMPT_TEMPLATE = "Compute {expr}.\nSolution:\n"
MAX_VALUE = 999
SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class Problem:
    """One problem: prompt text, reference solution text and integer answer."""

    expr: str
    steps: tuple[tuple[int, str, int, int], ...]  # (a, op, b, result)
    answer: int
    spell_products: bool = False

    @property
    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(expr=self.expr)

    @property
    def question(self) -> str:
        """The problem as a user asks it, without the task's ``Solution:`` cue: what a backend sends (the
        served Target adds the cue for the shipped target, a chat template for a chat model)."""
        return f"Compute {self.expr}."

    @property
    def solution(self) -> str:
        steps = [format_step(*s, spell=self.spell_products) for s in self.steps]
        return THOUGHT_SEP.join(steps + [f"\\boxed{{{self.answer}}}"])

    @property
    def n_ops(self) -> int:
        return len(self.steps)

    @property
    def split(self) -> str:
        return split_of(self.expr)

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "answer": str(self.answer), "solution": self.solution,
                "n_ops": self.n_ops}


@dataclass
class TaskConfig:
    """Distribution of problems: number of operations drawn uniformly from [min_ops, max_ops]."""

    min_ops: int = 2
    max_ops: int = 8
    spell_products: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops:
            raise ValueError(f"need 1 <= min_ops <= max_ops, got {self.min_ops}, {self.max_ops}")


def format_step(a: int, op: str, b: int, result: int, spell: bool = False) -> str:
    """One thought: ``74*5=370``; spelled, ``374*2=300*2+70*2+4*2=600+140+8=748``."""
    if not spell or op != "*" or a < 10:
        return f"{a}{op}{b}={result}"
    digits = str(a)
    parts = [int(d) * 10 ** (len(digits) - 1 - i) for i, d in enumerate(digits) if d != "0"]
    if len(parts) == 1:
        return f"{a}*{b}={result}"
    terms = "+".join(f"{p}*{b}" for p in parts)
    products = "+".join(str(p * b) for p in parts)
    return f"{a}*{b}={terms}={products}={result}"


def split_of(expr: str) -> str:
    """Fixed split by problem text: 80% train, 10% dev, 10% test, independent of any seed."""
    h = int.from_bytes(hashlib.sha256(expr.encode()).digest()[:4], "big") % 100
    return "train" if h < 80 else ("dev" if h < 90 else "test")


def _next_op(rng: random.Random, value: int) -> tuple[str, int] | None:
    choices = []
    if value + 1 <= MAX_VALUE:
        choices.append("+")
    if value >= 1:
        choices.append("-")
    if 2 * value <= MAX_VALUE and value >= 1:
        choices.append("*")
    op = rng.choice(choices)
    if op == "+":
        return op, rng.randint(1, min(99, MAX_VALUE - value))
    if op == "-":
        return op, rng.randint(1, min(99, value))
    return op, rng.randint(2, min(9, MAX_VALUE // value))


def make_problem(rng: random.Random, n_ops: int, spell_products: bool = False) -> Problem:
    """A chain of ``n_ops`` operations starting from a number in [2, 99]."""
    if n_ops < 1:
        raise ValueError(f"n_ops must be >= 1, got {n_ops}")
    value = rng.randint(2, 99)
    expr = str(value)
    steps = []
    prev_additive = False
    for _ in range(n_ops):
        op, b = _next_op(rng, value)
        if op == "*" and prev_additive:
            expr = f"({expr})"
        expr = f"{expr}{op}{b}"
        result = value + b if op == "+" else value - b if op == "-" else value * b
        steps.append((value, op, b, result))
        value = result
        prev_additive = op in "+-"
    return Problem(expr=expr, steps=tuple(steps), answer=value, spell_products=spell_products)


MAX_MISSES = 200_000  # draws in a row without a new problem before ``generate`` says the range is spent


class TooFewProblems(ValueError):
    """``generate`` was asked for more distinct problems than a split holds in its operation range; a
    command re-says it with its own flags (``said``): the bare message named none of them."""

    def __init__(self, split: str, found: int, asked: int, config: TaskConfig) -> None:
        self.split, self.found, self.asked, self.config = split, found, asked, config
        super().__init__(self.said("the count", "min_ops/max_ops"))

    def __reduce__(self):
        """Rebuilt from its fields: pickle's default calls the class with ``args`` (the message alone),
        a TypeError wherever the error crosses a process (a Ray task's failure)."""
        return type(self), (self.split, self.found, self.asked, self.config)

    def said(self, count_flag: str, range_flags: str = "--min-ops/--max-ops") -> str:
        c = self.config
        return (f"only {self.found} distinct {self.split} problems with {c.min_ops}-{c.max_ops} operations "
                f"found ({MAX_MISSES:,} draws without a new one); asked for {self.asked}: lower {count_flag} "
                f"to at most {self.found}, or widen {range_flags}")


def generate(split: str, n: int, seed: int, config: TaskConfig | None = None) -> list[Problem]:
    """``n`` distinct problems of ``split``, reproducible from ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {SPLITS}")
    config = config or TaskConfig()
    rng = random.Random(f"{split}:{seed}")
    out: list[Problem] = []
    seen: set[str] = set()
    misses = 0
    while len(out) < n:
        p = make_problem(rng, rng.randint(config.min_ops, config.max_ops), config.spell_products)
        if p.split == split and p.expr not in seen:
            seen.add(p.expr)
            out.append(p)
            misses = 0
        else:  # a small range holds few distinct problems: asked for more, this looped forever
            misses += 1
            if misses > MAX_MISSES:
                raise TooFewProblems(split, len(out), n, config)
    return out


def check_answer(completion: str, answer: int | str) -> bool:
    """True when the last ``\\boxed{}`` of ``completion`` holds the right integer."""
    return check_integer(extract_boxed(completion), answer)


def check_thought(thought: str) -> bool | None:
    """Whether one arithmetic thought ``a op b = ... = c`` is correct; None if it is not one."""
    lhs, _, rest = thought.partition("=")
    if not rest:
        return None
    sides = [lhs] + rest.split("=")
    values = [_evaluate(s) for s in sides]
    if any(v is None for v in values):
        return None
    return all(v == values[0] for v in values)


_TOKEN = re.compile(r"\d+|[-+*]")


def _evaluate(side: str) -> int | None:
    """Value of ``side`` as written with integers, ``+``, ``-`` (also a sign) and ``*``, else None. Not
    Python's eval: a long run of "+1" ended in a RecursionError, a long run of "-" in a MemoryError
    (both escaped the rollout labeller), and "07*2=14" was no thought (a leading zero is Python's
    SyntaxError). No power is a step here (eval("9**9**9") would not finish)."""
    if not side.strip() or not set(side) <= _CHARS or re.search(r"\d\s+\d", side):
        return None
    total, product, sign, operand = 0, None, 1, True  # operand: a number (or a sign) comes next
    for tok in _TOKEN.findall(side):
        if operand and tok in "+-":
            sign = -sign if tok == "-" else sign
        elif operand and tok != "*":
            try:
                factor = sign * int(tok)
            except ValueError:  # over the int-string digit limit
                return None
            product, sign, operand = factor if product is None else product * factor, 1, False
        elif operand:
            return None  # "2**3", "2+*3", "*3"
        elif tok == "*":
            operand = True
        else:
            total, product, sign, operand = total + product, None, -1 if tok == "-" else 1, True
    return None if operand else total + product


_CHARS = set("0123456789+-* ")
