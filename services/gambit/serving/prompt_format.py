"""The text a Target's model is given for a problem: the model's own prompt format, applied by the server.

A backend sends the problem alone (``SolveRequest.problem``); the Target knows its model. A chat model
(a ``chat_template`` in ``tokenizer_config.json``: SmolLM2-Instruct, any instruct checkpoint) gets the
problem as one user turn followed by the usual math-reasoning instruction, so its answer comes in the
``\\boxed{}`` the vote reads; a base model such as the shipped target gets the task's format,
``<problem>\\nSolution:\\n`` (unchanged when the problem already ends with ``Solution:``, as clients
that formatted it themselves send). ``SolveRequest.raw_prompt`` skips both.

A problem is text: one holding a special token's text (``<|im_end|>`` of a ChatML model, the shipped
target's ``<eos>``) is refused (``check_special_text``), as the tokenizer would read it as the control
token and a request could end its turn and write the model's system turn or its answer. With
``raw_prompt`` the caller owns the whole prompt, control tokens included.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gambit.model.chat_template import chat_template, render_user_turn
from gambit.tasks.arithmetic import PROMPT_TEMPLATE

TASK_SUFFIX = PROMPT_TEMPLATE.split("{expr}.", 1)[1]  # "\nSolution:\n": what follows the problem
# DeepSeek-R1's and Qwen2.5-Math's instruction for math problems (the answer where the checker reads it)
BOXED = "Please reason step by step, and put your final answer within \\boxed{}."


def task_prompt(problem: str) -> str:
    """The shipped task's format around ``problem`` (a blank problem stays blank: refused upstream). A
    problem that already ends with "Solution:" gets the format exactly: sent as it was, without the
    newline after it (or the one before), the model began mid-expression (135 for (4+5)*3)."""
    if not problem.strip():
        return problem
    body = problem.rstrip().removesuffix(TASK_SUFFIX.strip())
    return body.rstrip() + TASK_SUFFIX


def check_special_text(problem: str, tokenizer, field: str = "problem",
                       remedy: str = "remove it, or send the whole prompt with raw_prompt") -> str:
    """``problem``, or a ValueError naming ``field`` and the first special token its text encodes to
    (module docstring; ``tokenizer``: a ``gambit.model.tokenizer.Tokenizer``)."""
    found = tokenizer.first_special(problem)
    if found is not None:
        token, at = found
        raise ValueError(f"{field}: contains the special token {token!r} at character {at}: the model would "
                         "read it as its control token, not as text (a request may not write the model's "
                         f"turns); {remedy}")
    return problem


def problem_formatter(model: str | Path) -> Callable[[str], str]:
    """``problem -> prompt`` for ``model``, a folder or a registered name such as ``smollm2`` (module
    docstring)."""
    from gambit.model.registry import resolve_model

    template = chat_template(resolve_model(model))
    if template is None:
        return task_prompt
    return lambda problem: render_user_turn(template, f"{problem.strip()}\n{BOXED}")
