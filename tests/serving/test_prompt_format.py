"""The Target applies its model's prompt format to a problem (a backend sends the problem alone)."""

from __future__ import annotations

import json

import pytest

from gambit.paths import TARGET
from gambit.serving.embedded import Embedded, EmbeddedConfig
from gambit.serving.prompt_format import BOXED, problem_formatter, task_prompt
from gambit.serving.solve_config import SolveConfig, check_problem
from gambit.tasks.arithmetic import TaskConfig, generate


def test_task_format_is_added_once_and_never_to_a_blank_problem():
    assert task_prompt("Compute (4+5)*3. ") == "Compute (4+5)*3.\nSolution:\n"
    assert task_prompt("Compute (4+5)*3.\nSolution:\n") == "Compute (4+5)*3.\nSolution:\n"
    # the suffix half given: the format exactly (sent as it was, the model began mid-expression)
    for partial in ("Compute (4+5)*3.\nSolution:", "Compute (4+5)*3. Solution:",
                    "Compute (4+5)*3.\nSolution:\n\n"):
        assert task_prompt(partial) == "Compute (4+5)*3.\nSolution:\n", partial
    p = generate("test", 1, 0, TaskConfig(2, 4))[0].prompt  # the task's own prompts pass unchanged
    assert task_prompt(p) == p and task_prompt(p.removesuffix("\nSolution:\n")) == p
    for blank in ("", "  ", "\n\t"):
        assert task_prompt(blank) == blank
        with pytest.raises(ValueError, match="problem: empty"):
            check_problem(task_prompt(blank))


def test_a_chat_model_gets_its_template_and_the_boxed_answer_instruction(tmp_path):
    assert problem_formatter(TARGET) is task_prompt  # the shipped target: a base model, no template
    template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    got = problem_formatter(tmp_path)(" What is 12 + 30? ")
    assert got == f"<|user|>What is 12 + 30?\n{BOXED}<|end|><|assistant|>"


def test_smollm2_template_renders_a_user_turn(smollm2_folder):
    got = problem_formatter(smollm2_folder)("What is 12 + 30?")
    assert got.endswith("<|im_start|>assistant\n") and f"<|im_start|>user\nWhat is 12 + 30?\n{BOXED}" in got


def test_a_served_run_gets_the_format_unless_raw_prompt():
    """The bare problem and the task-formatted one are the same run (same traces); raw_prompt sends the
    bare text, which the shipped target continues as another prompt."""
    p = generate("test", 1, 0, TaskConfig(2, 4))[0].prompt
    bare = p.removesuffix("\nSolution:\n")
    cfg = dict(capacity=4, swap=1, round_interval=8, warmup=4, max_tokens=48, seed=2)
    e = Embedded(EmbeddedConfig(num_blocks=300))
    try:
        runs = {name: list(e.solve(text, SolveConfig(**cfg, raw_prompt=raw)))[-1]
                for name, text, raw in (("formatted", p, False), ("bare", bare, False), ("raw", bare, True))}
    finally:
        e.close()
    assert runs["bare"]["traces"] == runs["formatted"]["traces"]  # ids, parents, answers, tokens, scores
    assert runs["bare"]["answer"] == runs["formatted"]["answer"]
    assert runs["bare"]["prompt_tokens"] == runs["formatted"]["prompt_tokens"]
    assert runs["raw"]["prompt_tokens"] < runs["formatted"]["prompt_tokens"]
