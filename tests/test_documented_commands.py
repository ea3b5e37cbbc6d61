"""Every command the docs show still parses: a renamed flag, a dropped choice or a removed make target in
README.md, loadtest/README.md or examples/ was found only by a user pasting it. Nothing runs: `gambit`
commands go through the CLI's own parsers (and the flags' dataclass checks), `make` targets are looked
up in the Makefile, and the repository files a command names must exist."""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.util
import io
import itertools
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "loadtest" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted(p for p in (ROOT / "examples").iterdir() if p.suffix in (".py", ".md"))]
# a command line; not a message such as "gambit serve: error: ..." quoted from a terminal
COMMAND = re.compile(r"(?:\.venv/bin/)?gambit(?![\w ]*:\s)(?:\s|$)|make\s|python3? -m gambit|"
                     r"(?:\.venv/bin/)?python3? examples/\w+\.py")
EXAMPLE = re.compile(r"(?:\.venv/bin/)?python3? (examples/\w+\.py)")
# placeholders the docs write for a value: substituted by one of the right kind
PLACEHOLDERS = {"N": "3", "B": "0.5", "F": "out.json", "FILE": "out.json", "RUN": "p2", "RUN_ID": "r1",
                "REV": "HEAD", "DIR": "some/folder", "...": "x", "…": "x"}
# prose that names commands rather than giving one, each with why it is not checked as a command line
ALLOWED = {
    "gambit run/eval/bench engine": "three commands named together in prose",
    "gambit eval/run --model smollm2": "two commands named together in prose",
}
# flags whose value is something the command writes: no need for it to exist
OUTPUT_FLAGS = {"--json", "--plot", "--png", "--out", "--summary-csv", "--csv-prefix", "--plots"}
REPO_DIRS = {p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")} - {"results"}


@dataclass(frozen=True)
class Doc:
    """One command line of a doc: where it is and its text (continuations joined, `\\|` unescaped)."""

    path: Path
    line: int
    text: str
    kind: str = "block"  # or "span": inline code in prose

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.text}"


def doc_commands(path: Path) -> list[Doc]:
    """The `gambit`/`make`/`python -m gambit` lines of fenced or indented blocks and inline spans."""
    text = path.read_text()
    found, fenced, held = [], False, None
    for i, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*(```|~~~)", line):
            fenced = not fenced
            continue
        if not (fenced or line.startswith("    ")):
            held = None
            continue
        body = line.strip().removeprefix("$ ")
        if held is not None:  # a continuation of the line above (`\` at its end)
            held = Doc(path, held.line, held.text[:-1].rstrip() + " " + body)
        elif COMMAND.match(body):
            held = Doc(path, i, body)
        else:
            continue
        if held.text.endswith("\\"):
            continue
        found.append(held)
        held = None
    for m in re.finditer(r"(?<!`)`([^`\n]+(?:\n[^`\n]+)?)`(?!`)", text):  # a span may wrap once
        body = " ".join(m[1].split()).replace("\\|", "|")
        if COMMAND.match(body):
            found.append(Doc(path, text.count("\n", 0, m.start()) + 1, body, "span"))
    return found


ALL = [d for p in DOCS for d in doc_commands(p)]


def variants(text: str) -> list[tuple[list[str], frozenset, bool]]:
    """The argv lists a doc line stands for, each with the choices it made and whether a placeholder
    stands in it for a value: `# comment` and shell redirections dropped, each `[...]` group left out
    or given (`[a | b]`: a or b), each `a|b` word at each alternative, a placeholder given a value (an
    elision, `...`, dropped where no flag takes it as its value)."""
    pieces = re.split(r"\[([^\]]+)\]", text)  # odd items: the optional groups
    options = [[(p, None)] if k % 2 == 0 else
               [("", None), *((a, f"[{a}]") for a in re.split(r"\s+\|\s+", p))]  # `[a | b]`: a or b
               for k, p in enumerate(pieces)]
    out = []
    for parts in itertools.product(*options):
        words = shlex.split(" ".join(p for p, _ in parts), comments=True)
        for stop in ("<", ">", "|", "&&", ";", "2>&1"):
            words = words[:words.index(stop)] if stop in words else words
        words = [w for before, w in zip(["", *words], words, strict=False)
                 if w not in ("...", "…") or before.startswith("--")]
        alternatives = [[(a, f"{w} = {a}") for a in w.split("|")] if "|" in w else [(w, None)] for w in words]
        for argv in itertools.product(*alternatives):
            chosen = frozenset(c for _, c in parts if c) | frozenset(c for _, c in argv if c)
            out.append(([PLACEHOLDERS.get(w, w) for w, _ in argv], chosen,
                        any(w in PLACEHOLDERS for w, _ in argv)))
    return out


def make_targets() -> set[str]:
    """Every target the Makefile and the files it includes define."""
    makefile = (ROOT / "Makefile").read_text()
    included = re.findall(r"^-?include\s+(\S+)", makefile, re.M)
    texts = [makefile] + [(ROOT / inc).read_text() for inc in included if (ROOT / inc).is_file()]
    return {t for text in texts for m in re.finditer(r"^([\w.+-]+(?:\s+[\w.+-]+)*)\s*:(?!=)", text, re.M)
            for t in m[1].split()}


class _Parsed(Exception):
    """Raised where a bench command's own parser returned: its flags were taken, nothing runs."""

    def __init__(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        super().__init__()
        self.parser, self.namespace = parser, args


@pytest.fixture(scope="module")
def gambit_parsers():
    """The CLI's parser and the dataclass each (sub)parser's flags come from, recorded as it is built."""
    import gambit.cli
    import gambit.config_cli
    import gambit.ops.cli
    import gambit.scoring.cli
    import gambit.serving.commands  # noqa: F401 — its add_dataclass_args is recorded below

    configs: dict[int, tuple[argparse.ArgumentParser, type]] = {}  # the parser kept: its id stays its
    original = gambit.config_cli.add_dataclass_args

    def recorded(parser, cls, skip=()):
        configs[id(parser)] = parser, cls
        return original(parser, cls, skip)

    with pytest.MonkeyPatch.context() as mp:
        for mod in [m for name, m in sys.modules.items() if name.startswith("gambit")]:
            if getattr(mod, "add_dataclass_args", None) is original:
                mp.setattr(mod, "add_dataclass_args", recorded)
        parser = gambit.cli.build_parser()
        yield parser, configs


def check_gambit(argv: list[str], parser: argparse.ArgumentParser, configs: dict,
                 values: bool = True) -> str:
    """"" if ``gambit argv`` parses and (``values``) its values pass their dataclass's checks, else why
    not."""
    import gambit.cli
    from gambit.config_cli import from_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if argv[:1] == ["bench"] and argv[1:2] and argv[1] in gambit.cli.OWN_PARSERS:
                sub, args = _bench_parsed(gambit.cli.OWN_PARSERS[argv[1]], argv[2:])
            else:
                args, extra = parser.parse_known_args(argv)
                if extra:
                    return f"unrecognized arguments: {' '.join(extra)}"
                sub = gambit.cli._subparser(parser, argv)
            if values and configs.get(id(sub), (None,))[0] is sub:
                from_args(configs[id(sub)][1], args)
    except SystemExit as e:
        if e.code in (0, None):  # --help
            return ""
        return (err.getvalue().strip().splitlines() or [str(e)])[-1]
    except (OSError, ValueError) as e:
        return str(e)
    return ""


def _bench_parsed(module: str, argv: list[str], parse: bool = True):
    """A `gambit bench NAME` command's own parser (built in its main) stopped right after it parsed
    ``argv`` (``parse=False``: before; the namespace is then None)."""
    import importlib

    return _parsed_main(importlib.import_module(module).main, argv, parse)


def _parsed_main(main, argv: list[str], parse: bool = True):
    """``main(argv)`` stopped where its parser returned: (the parser, the namespace)."""
    original = argparse.ArgumentParser.parse_args

    def parsed(self, args=None, namespace=None):
        raise _Parsed(self, original(self, args, namespace) if parse else None)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", parsed)
        try:
            main(argv)
        except _Parsed as p:
            return p.parser, p.namespace
    raise AssertionError(f"{main.__module__}.main never parsed its arguments")


def repo_paths(argv: list[str]) -> list[str]:
    """The repository files ``argv`` reads (outputs, results/ and paths outside the checkout left out)."""
    paths = []
    for before, word in zip(["", *argv], argv, strict=False):
        flag, _, value = word.partition("=") if word.startswith("--") else (before, "", word)
        if flag in OUTPUT_FLAGS or "*" in value or "{" in value:
            continue
        for v in value.split(","):
            if "/" in v and v.split("/")[0] in REPO_DIRS:
                paths.append(v)
    return paths


def test_the_docs_have_commands():
    """The extraction finds the README's commands: an empty list would pass everything."""
    assert len([d for d in ALL if d.path.name == "README.md"]) > 100
    assert any(d.text.startswith("make ") for d in ALL)


def test_make_targets_exist():
    targets = make_targets()
    bad = [f"{d}: no target {t!r} in the Makefile" for d in ALL if d.text.startswith("make ")
           for argv, *_ in variants(d.text) for t in argv[1:] if not t.startswith("-") and "=" not in t
           and t not in targets]
    assert not bad, "\n".join(bad)


def test_python_modules_exist(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "services"))
    bad = []
    for d in (d for d in ALL if re.match(r"python3? -m", d.text)):
        module = shlex.split(d.text)[2]
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        bad += [] if found else [f"{d}: no module {module}"]
    assert not bad, "\n".join(bad)


def mentioned_flags_exist(argv: list[str], parser: argparse.ArgumentParser) -> str:
    """"" if every `--flag` of ``argv`` is one of its command's (or, where that is a group such as
    `gambit client`, one of its subcommands'): prose naming a command's flags without values."""
    import gambit.cli

    if argv[:1] == ["bench"] and argv[1:2] and argv[1] in gambit.cli.OWN_PARSERS:
        sub = _bench_parsed(gambit.cli.OWN_PARSERS[argv[1]], [], parse=False)[0]
    else:
        sub = gambit.cli._subparser(parser, argv)
    stack, flags = [sub], set()
    while stack:
        p = stack.pop()
        flags |= {f for a in p._actions for f in a.option_strings}
        action = gambit.cli._commands(p)
        stack += list(action.choices.values()) if action else []
    unknown = [w for w in argv if w.startswith("--") and w.split("=")[0] not in flags]
    return f"{sub.prog} has no {', '.join(unknown)}" if unknown else ""


def outside_the_checkout(argv: list[str]) -> bool:
    """Whether ``argv`` reads a path outside the checkout (`../shared/datasets/...`, `~/.cache/...`):
    this machine's state, not the docs'."""
    return any(re.match(r"(\.\./|~)", w.partition("=")[2] if w.startswith("--") else w) for w in argv)


@pytest.fixture
def fetched_models(monkeypatch, tmp_path):
    """Every registered model "fetched" (a folder with the shipped target's config.json) in a cache of
    its own: `--model smollm2` is checked on a machine that never fetched it too."""
    import shutil

    from gambit.model.registry import MODELS

    for name in MODELS:
        (tmp_path / "models" / name).mkdir(parents=True)
        shutil.copy(ROOT / "services" / "gambit" / "assets" / "target" / "config.json",
                    tmp_path / "models" / name / "config.json")
    monkeypatch.setenv("GAMBIT_CACHE", str(tmp_path))


def test_gambit_commands_parse(gambit_parsers, monkeypatch, fetched_models):
    """Each `gambit ...` line is taken by the CLI's parsers, every optional part and alternative of it
    in at least one variant; the shipped-with-the-repo files it names exist. An inline span that names a
    command or its flags without their values (prose: "`gambit scorer serve --max-rows`") needs only
    the command and the flags to exist."""
    parser, configs = gambit_parsers
    monkeypatch.chdir(ROOT)  # the docs' relative paths are the checkout's
    bad = []
    for d in ALL:
        if not re.match(r"(\.venv/bin/)?gambit\b", d.text) or d.text in ALLOWED:
            continue
        results = []
        for argv, chosen, placeheld in variants(d.text):
            argv = argv[1:]  # a placeholder's value is no real one, nor a path outside the checkout:
            # parsed, the values' checks not run
            values = not (placeheld or outside_the_checkout(argv))
            why = check_gambit(argv, parser, configs, values) if argv else ""
            if why and d.kind == "span" and re.search(r"expected one argument|arguments are required|"
                                                      r"argument what: invalid choice", why):
                why = mentioned_flags_exist(argv, parser)
            missing = [p for p in repo_paths(argv) if not (ROOT / p.split("=")[-1]).exists()]
            why = why or (f"no such file in the repository: {', '.join(missing)}" if missing else "")
            results.append((argv, chosen, why))
        passed = set().union(*(c for _, c, why in results if not why))
        never = sorted(set().union(*(c for _, c, _ in results)) - passed)
        if any(not why for *_, why in results) and not never:  # one works, and each choice in one
            continue
        argv, _, why = next((r for r in results if r[2] and r[1] & set(never)), results[0])
        bad.append(f"{d}\n    gambit {shlex.join(argv)}\n    -> {why}"
                   + (f"\n    (no variant works with: {'; '.join(never)})" if never else ""))
    assert not bad, f"{len(bad)} documented command(s) no longer work:\n" + "\n".join(bad)


REPO_PATH = re.compile(r"(?<![\w./~$-])(?:" + "|".join(sorted(REPO_DIRS)) + r")/[\w./*+-]*[\w*]")


def test_named_repo_files_exist():
    """A repository file named in a command block or an inline span (`tools/pr_oracle.py`,
    `docs/figures/step_threads_*.json`) is there: a renamed script left its old name in the docs."""
    bad = []
    for path in DOCS:
        text = path.read_text()
        spans = [(m.start(), m[1]) for m in re.finditer(r"(?<!`)`([^`\n]+)`(?!`)", text)]
        spans += [(m.start(), m[2]) for m in re.finditer(r"^(```|~~~).*\n([\s\S]*?)^\1", text, re.M)]
        for start, span in spans:
            for m in REPO_PATH.finditer(span):
                name = m[0]
                if not (glob.glob(str(ROOT / name)) if "*" in name else (ROOT / name).exists()):
                    line = text.count("\n", 0, start + m.start()) + 1 + (span[:m.start()].count("\n"))
                    bad.append(f"{path.relative_to(ROOT)}:{line}: {name}: no such file in the repository")
    assert not bad, "\n".join(bad)


def _docs_are(monkeypatch, tmp_path: Path, text: str) -> None:
    """The checks below pointed at one README holding ``text``, in a checkout of its own."""
    (tmp_path / "README.md").write_text(text)
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "DOCS", [tmp_path / "README.md"])
    monkeypatch.setattr(here, "ALL", doc_commands(tmp_path / "README.md"))
    monkeypatch.setattr(here, "ROOT", tmp_path)


@pytest.mark.parametrize(("doc", "why"), [
    ("gambit run --modle smollm2", "unrecognized arguments: --modle"),  # a renamed flag
    ("gambit train drafter --method eagle4", "--method"),  # a choice removed
    ("gambit bench engine --tokenz 3", "unrecognized arguments: --tokenz"),  # a bench command's own parser
    ("gambit bench rounds --stor", "has no --stor"),  # a flag named in prose
    ("gambit bench serve --store foo", "--store must be a redis://"),  # its dataclass's checks
    ("gambit clients solve x", "invalid choice"),  # a command renamed
])
def test_the_check_catches_drift(gambit_parsers, monkeypatch, tmp_path, doc, why):
    """The check is not vacuous: drifted lines fail it, each with the reason named."""
    _docs_are(monkeypatch, tmp_path, f"Run `{doc}`.\n")
    with pytest.raises(AssertionError, match=re.escape(why)):
        test_gambit_commands_parse(gambit_parsers, monkeypatch, None)


def test_the_make_and_path_checks_catch_drift(gambit_parsers, monkeypatch, tmp_path):
    _docs_are(monkeypatch, tmp_path, "`make run`, `make no-such-target` and `tools/no_such_script.py`\n")
    (tmp_path / "Makefile").write_text("run:\n\t.venv/bin/gambit run --modle smollm2 & wait\n")
    with pytest.raises(AssertionError, match="no target 'no-such-target'"):
        test_make_targets_exist()
    with pytest.raises(AssertionError, match="tools/no_such_script.py: no such file"):
        test_named_repo_files_exist()
    with pytest.raises(AssertionError, match="make run: .venv/bin/gambit run --modle smollm2"):
        test_make_recipes_gambit_commands_parse(gambit_parsers, monkeypatch, None)


def test_example_commands_parse(monkeypatch):
    """`python examples/NAME.py ...` as the docs give it is taken by the example's own parser."""
    monkeypatch.chdir(ROOT)
    bad = []
    for d in ALL:
        m = EXAMPLE.match(d.text)
        if not m:
            continue
        script = ROOT / m[1]
        if not script.is_file():
            bad.append(f"{d}: no such file in the repository: {m[1]}")
            continue
        spec = importlib.util.spec_from_file_location(f"_doc_example_{script.stem}", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for argv, *_ in variants(d.text[m.end():]):
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    _parsed_main(module.main, argv)
            except SystemExit as e:
                if e.code not in (0, None):
                    bad.append(f"{d}\n    -> {(err.getvalue().strip().splitlines() or [str(e)])[-1]}")
    assert not bad, "\n".join(bad)


def test_make_recipes_gambit_commands_parse(gambit_parsers, monkeypatch, fetched_models):
    """The `gambit ...` commands inside the recipes of the make targets the docs name (`make -n`: printed,
    not run) are taken by the CLI's parsers too: `make shipped-models` is documented through them."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    parser, configs = gambit_parsers
    monkeypatch.chdir(ROOT)
    targets = sorted({t for d in ALL if d.text.startswith("make ") for argv, *_ in variants(d.text)
                      for t in argv[1:] if not t.startswith("-") and t in make_targets()})
    bad = []
    for target in targets:
        dry = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=30)
        if dry.returncode:
            bad.append(f"make -n {target}: {dry.stderr.strip()}")
            continue
        for line in dry.stdout.replace("\\\n", " ").splitlines():  # continuations joined
            words = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            words.whitespace_split = True
            segment: list[str] = []
            for w in [*words, ";"]:
                if w.strip(";&|"):
                    segment.append(w)
                    continue
                if segment and segment[0].endswith("bin/gambit"):
                    why = check_gambit(segment[1:], parser, configs, values=False)
                    bad += [f"make {target}: {shlex.join(segment)}\n    -> {why}"] if why else []
                segment = []
    assert not bad, "\n".join(bad)


def test_loadtest_options_table_matches_the_locustfile():
    """loadtest/README.md's table of the locustfile's own options (Locust's --help does not list them)
    names each option the locustfile adds, and no other."""
    table = set(re.findall(r"^\| `(--[\w-]+)`", (ROOT / "loadtest" / "README.md").read_text(), re.M))
    locustfile = (ROOT / "loadtest" / "locustfile.py").read_text()
    added = set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", locustfile))
    assert table == added, (f"in the table only: {sorted(table - added)}; "
                            f"in locustfile.py only: {sorted(added - table)}")
