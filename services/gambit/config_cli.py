"""One configuration surface: dataclass fields become CLI flags; ``--config FILE.yaml`` sets defaults.

Precedence: explicit flag > YAML file > dataclass default. Validation stays in each dataclass's
``__post_init__``, so a bad value gets the same clear error from either surface. A class with
``FLAG_ERRORS = True`` (run, eval, train, client, cluster, serve, scorer serve, loadtest and the bench
commands') has its errors name the flags ("--kv-share must be ...", not "kv_share must be ..."; a value
from the YAML file keeps its key) on one line that opens with the command, "gambit bench search: error:
...", and exit 2, as argparse's do.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import types
import typing
from pathlib import Path

import yaml

_KIND = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _base_type(tp):
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0] if args else str
    return tp


def field_comments(cls) -> dict[str, str]:
    """The trailing ``# comment`` of each field line in the class source (and its dataclass bases', so
    an inherited field keeps its help): the flag's help text."""
    notes: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            src = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        found = (re.match(r"\s+(\w+)\s*:[^#]*#\s*(.+)$", line) for line in src.splitlines())
        notes.update({m[1]: m[2].strip().replace("%", "%%") for m in found if m})
    return notes


class DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with the flag's default where its text does not already give one (a switch
    that is off, or a None that the text explains, says nothing more)."""

    def _get_help_string(self, action) -> str:
        text = action.help or ""
        d = action.default  # `in (None, False)` also held for 0 (0 == False): no int flag said its 0
        if action.option_strings and d is not None and d is not False and d != argparse.SUPPRESS:
            text = _with_default(text, "" if action.default == "" else "%(default)s")
        return text


def _with_default(note: str, default) -> str:
    """A flag's help line ending with its default, unless the note already says it (an empty string's
    meaning too: '("" = the shipped ones)'); an empty default otherwise shows as "", not as nothing."""
    said = re.search(r"\(default\b|default[:)]", note, re.I)  # "(default: …)", "(-1 = server default)"
    if said or (default == "" and ('""' in note or "empty" in note)) or (default is None and "unset" in note):
        return note
    shown = '""' if default == "" else default
    return f"{note} (default: {shown})".lstrip()


def add_dataclass_args(parser: argparse.ArgumentParser, cls, skip: tuple[str, ...] = ()) -> None:
    """Add ``--field-name`` for each field (default None, so we can tell what was given)."""
    hints = typing.get_type_hints(cls)
    notes = field_comments(cls)
    # from_args's errors open with the command, as argparse's; a field with no flag here is no option of
    # the command in its YAML file either (`cluster status` took `timeout_s:` and never waited)
    no_flag = tuple(f.name for f in dataclasses.fields(cls) if f.name in skip or f.name.startswith("_")
                    or not f.init or _base_type(hints[f.name]) not in _KIND)
    parser.set_defaults(_prog=parser.prog, _no_flag=no_flag)
    parser.add_argument("--config", help="YAML file of these options' values, keyed by their names with "
                        "underscores (max_tokens: 200); a flag given as well wins over the file")
    for f in dataclasses.fields(cls):
        if f.name in no_flag:
            continue
        tp = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else None
        note = notes.get(f.name, "")
        text = _with_default(note, default)
        if tp is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            parser.add_argument(flag, type=tp, default=None, help=text)


def yaml_value(path: Path, name: str, hint, value):
    """A YAML value converted as its flag's text would be (``1e-4``, which YAML 1.1 reads as a string,
    is a number; ``gold: 18`` is the string "18"), or a clear error naming the option and the file."""
    tp = _base_type(hint)
    if tp not in _KIND or value is None and type(None) in typing.get_args(hint):
        return value
    if tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    if tp is bool and isinstance(value, bool):
        return value
    numeric = (int, str) if tp is int else (int, float, str)  # 2.5 is no integer; true is neither
    if tp in (int, float) and isinstance(value, numeric) and not isinstance(value, bool):
        try:
            return tp(value)
        except ValueError:
            pass
    got = repr(value) if value is not None else "nothing" + (" (write '' for none)" if tp is str else "")
    raise SystemExit(f"error: {path}: {name}: expected {_KIND[tp]}, got {got}")


def flag_named(message: str, names) -> str:
    """``message`` (a dataclass check's: "kv_share must be in (0, 4], got 0") with the field it starts
    with, if one of ``names``, spelt as its flag: "--kv-share must be in (0, 4], got 0"; a field with an
    underscore later in it too ("min_ops <= max_ops": "--min-ops <= --max-ops"), a plain word there
    being prose ("a model folder")."""
    def one(word: str, first: bool) -> str:
        return "--" + word.replace("_", "-") if word in names and (first or "_" in word) else word

    def spelt(m: re.Match) -> str:
        words = m[0].split("/")  # "tls_cert/tls_key": each a flag, where every one of them is a field
        if len(words) > 1 and not all(w in names for w in words):
            return m[0]
        return "/".join(one(w, m.start() == 0) for w in words)

    return re.sub(r"(?<![\w\-./])[a-z]\w*(?:/[a-z]\w*)*", spelt, message)


class FlagError(SystemExit):
    """Exit 2 (argparse's code) after its line was printed; ``str()`` is that line, for a caller (or a
    test's ``pytest.raises(match=)``) that reads it: SystemExit("message") would have exited 1."""

    def __init__(self, line: str) -> None:
        super().__init__(2)
        self.line = line

    def __str__(self) -> str:
        return self.line


def flag_error(args: argparse.Namespace | None, message: str) -> FlagError:
    """One line, "gambit run: error: MESSAGE" (the command as ``add_dataclass_args`` noted its parser's
    prog; "error: MESSAGE" without one), printed on stderr, and the FlagError to raise."""
    prog = getattr(args, "_prog", None)
    line = f"{prog + ': ' if prog else ''}error: {message}"
    print(line, file=sys.stderr)
    return FlagError(line)


def flag_checked(args: argparse.Namespace, check, *a, **k):
    """``check(*a, **k)`` (a flag's check outside its dataclass: an output path) and its value, its
    ValueError said as ``flag_error`` says it, exit 2."""
    try:
        return check(*a, **k)
    except ValueError as e:
        raise flag_error(args, str(e)) from None


def _exit(cls, message: str, flags=(), args: argparse.Namespace | None = None):
    """The SystemExit for a bad configuration: "error: MESSAGE" and exit 1; for a ``FLAG_ERRORS``
    class, the fields in ``flags`` named as flags, printed here after the command, and exit 2
    ("gambit client get: error: --rpc-timeout-s: ...")."""
    if not getattr(cls, "FLAG_ERRORS", False):
        return SystemExit(f"error: {message}")
    return flag_error(args, flag_named(message, flags))


def _load_yaml(cls, path: Path, args: argparse.Namespace):
    """``path``'s YAML, or the one-line error naming the file (and for a syntax error its line and
    column): PyYAML's own message took two lines and named the file twice, a folder or a binary file
    ended as "[Errno 21] Is a directory" or "'utf-8' codec can't decode" without the file."""
    try:
        with path.open(encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except FileNotFoundError:
        raise _exit(cls, f"config file {path} does not exist", args=args) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        why = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise _exit(cls, f"{path}: malformed YAML{where}: {why}", args=args) from None
    except yaml.YAMLError as e:  # a reader error (a control character): its message is one line
        raise _exit(cls, f"{path}: malformed YAML: {' '.join(str(e).split())}", args=args) from None
    except UnicodeDecodeError as e:
        raise _exit(cls, f"{path}: not UTF-8 text (byte {e.start}); a YAML file of option values",
                    args=args) from None
    except OSError as e:
        raise _exit(cls, f"config file {path}: cannot read it ({e.strerror})", args=args) from None


def from_args(cls, args: argparse.Namespace, **fixed):
    """Build ``cls`` from YAML (if ``--config``) overlaid by the flags that were given."""
    values: dict = {}
    if getattr(args, "config", None):
        path = Path(args.config)
        loaded = _load_yaml(cls, path, args)
        if not isinstance(loaded, dict):
            raise _exit(cls, f"{path}: expected a mapping of option names to values", args=args)
        no_flag = set(getattr(args, "_no_flag", ()))  # a field this command has no flag for
        names = {f.name for f in dataclasses.fields(cls) if f.init} - no_flag
        unknown = sorted(set(loaded) - names, key=str)  # a YAML key may be a number: `1: 2`
        if unknown:
            prog = getattr(args, "_prog", None)
            elsewhere = [k for k in unknown if k in no_flag]
            why = f" ({', '.join(elsewhere)}: no option of {prog or 'this command'})" if elsewhere else ""
            raise _exit(cls, f"{path}: unknown options {unknown}{why}; known: {sorted(names)}", args=args)
        hints = typing.get_type_hints(cls)
        try:
            values.update({k: yaml_value(path, k, hints[k], v) for k, v in loaded.items()})
        except SystemExit as e:
            raise _exit(cls, str(e.code).removeprefix("error: "), args=args) from None
    from_file = set(values)
    for f in dataclasses.fields(cls):
        v = getattr(args, f.name, None)
        if v is not None:
            values[f.name] = v
            from_file.discard(f.name)
    values.update(fixed)
    try:
        return cls(**values)
    except (TypeError, ValueError) as e:
        # the fields with a flag on this parser, given there or at their defaults (not the file's)
        flags = {f.name for f in dataclasses.fields(cls) if hasattr(args, f.name)} - from_file - set(fixed)
        raise _exit(cls, str(e), flags, args) from None
