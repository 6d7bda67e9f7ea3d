"""Settings read from the environment, each declared once: the one mechanism of both binaries.

A ``Var`` declares a setting: its environment variable, its parser, a one-line doc, the field
of the settings object it sets (a dotted path; the field's default is the setting's default)
and, for the agent, its command line flag. From that declaration come:

- parsing: ``load`` (every variable onto a settings object), ``values`` (the ones set, by
  field, for settings with required fields) and ``read`` (one value); a bad value raises
  ``errors.SettingsError`` naming the variable and the value (``NAME='value': reason``);
- the flags: ``add_flag`` puts ``--flag`` on a parser with the help ``doc (NAME; default: D)``,
  and ``overrides`` applies the flags given over what the environment said, checked by the
  same parser (an error names the flag).

Parsers take the raw text (whitespace stripped) and raise ``ValueError`` with the reason; the
ones here (``text``, ``csv``, ``choice``, ``integer``, ``number``) cover what both binaries
read. An unset or empty variable keeps the default, unless ``keep_empty`` (then ``""`` is a
value) or ``required`` (then it is an error, ``NAME: not set``). Standard library only: the
operator imports this module (a public one of the agent).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from collscope.nodeagent import errors

T = TypeVar("T")
S = TypeVar("S")
Parser = Callable[[str], T]


@dataclasses.dataclass(frozen=True, slots=True)
class Var(Generic[T]):
    """One setting. ``field`` is where it lands in the settings object (``"server.listen_port"``);
    ``flag`` (with ``metavar``, ``choices`` and ``flag_type``, argparse's) makes it a flag;
    ``shown_default`` replaces the field's default in the help (``""``: none shown)."""

    env: str
    parse: Parser[T]
    doc: str
    field: str = ""
    required: bool = False
    hint: str = ""  # after "not set" when required and missing
    keep_empty: bool = False
    flag: str = ""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    flag_type: Callable[[str], Any] | None = None  # None: int or float as the default, else str
    shown_default: str | None = None


def read(env: Mapping[str, str], var: Var[T]) -> T | None:
    """``var``'s value in ``env``, None when unset (or empty); ``SettingsError`` when bad."""
    raw = env.get(var.env)
    text = "" if raw is None else raw.strip()
    if text == "" and not (var.keep_empty and raw is not None):
        if var.required:
            raise errors.SettingsError(var.env, "", f"not set{var.hint}")
        return None
    return _parse(var, var.env, text)


def values(env: Mapping[str, str], variables: Iterable[Var[Any]]) -> dict[str, Any]:
    """The variables set in ``env``, parsed, by field (in declaration order: the first bad or
    missing one is named)."""
    out = {}
    for var in variables:
        value = read(env, var)
        if value is not None:
            out[var.field] = value
    return out


def load(base: S, variables: Iterable[Var[Any]], env: Mapping[str, str]) -> S:
    """``base`` with every variable set in ``env`` applied to its field."""
    for var in variables:
        value = read(env, var)
        if value is not None:
            base = _apply(base, var, var.env, value)
    return base


def default(base: object, var: Var[Any]) -> str:
    """The default the help shows: ``shown_default``, else the field's value in ``base``."""
    if var.shown_default is not None:
        return var.shown_default
    value = _get(base, var.field)
    return f"{value:g}" if isinstance(value, float) else str(value)


def add_flag(p: argparse.ArgumentParser, var: Var[Any], base: object) -> None:
    """``var.flag`` on ``p``; absent from the namespace unless given (``SUPPRESS``)."""
    shown = default(base, var)
    where = f"{var.env}; default: {shown}" if shown else var.env
    options: dict[str, Any] = {"metavar": var.metavar, "choices": var.choices}
    kind = var.flag_type
    if kind is None:
        value = _get(base, var.field)
        kind = type(value) if type(value) in (int, float) else None
    options["type"] = kind
    p.add_argument(
        var.flag,
        default=argparse.SUPPRESS,
        help=f"{var.doc} ({where})",
        **{k: v for k, v in options.items() if v is not None},
    )


def overrides(base: S, variables: Iterable[Var[Any]], args: argparse.Namespace) -> S:
    """``base`` with the flags given in ``args`` applied, each checked by its variable's parser
    (a bad value names the flag)."""
    given = vars(args)
    for var in variables:
        dest = var.flag.lstrip("-").replace("-", "_")
        if var.flag and dest in given:
            value = _parse(var, var.flag, str(given[dest]))
            base = _apply(base, var, var.flag, value)
    return base


def text(raw: str) -> str:
    return raw


def csv(raw: str) -> tuple[str, ...]:
    """Comma-separated words, blanks dropped."""
    return tuple(x.strip() for x in raw.split(",") if x.strip())


def choice(*options: str, fold: Callable[[str], str] = str) -> Parser[str]:
    """One of ``options`` (after ``fold``, e.g. ``str.upper``)."""
    listed = ", ".join(options[:-1]) + f" or {options[-1]}" if len(options) > 1 else options[0]

    def parse(raw: str) -> str:
        if fold(raw) not in options:
            raise ValueError(f"must be {listed}")
        return fold(raw)

    return parse


def integer(minimum: int | None = None, maximum: int | None = None) -> Parser[int]:
    """A whole number within the bounds given."""

    def parse(raw: str) -> int:
        try:
            value = int(raw)
        except ValueError as e:
            raise ValueError("not an integer") from e
        return _bounded(value, minimum, maximum)

    return parse


def number(
    minimum: float | None = None, *, positive: bool = False, unit: str = "a number"
) -> Parser[float]:
    """A finite number, ``> 0`` when ``positive``, ``>= minimum`` when given."""

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError as e:
            raise ValueError(f"not {unit}") from e
        if not math.isfinite(value):
            raise ValueError("must be finite")
        if positive and not value > 0:
            raise ValueError("must be > 0")
        return _bounded(value, minimum, None)

    return parse


def _bounded(value: T, minimum: Any, maximum: Any) -> T:
    if minimum is not None and maximum is not None and not minimum <= value <= maximum:
        raise ValueError(f"must be in [{minimum}, {maximum}]")
    if minimum is not None and value < minimum:
        raise ValueError(f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ValueError(f"must be <= {maximum}")
    return value


def _parse(var: Var[T], name: str, text: str) -> T:
    try:
        return var.parse(text)
    except errors.SettingsError:
        raise
    except ValueError as e:
        raise errors.SettingsError(name, text, str(e)) from e


def _apply(base: S, var: Var[Any], name: str, value: object) -> S:
    """``base`` with ``var.field`` replaced; a field's own check (``__post_init__`` raising
    ``ValueError``) is reported as the variable's."""
    try:
        return _replace(base, var.field.split("."), value)
    except errors.SettingsError:
        raise
    except ValueError as e:
        raise errors.SettingsError(name, str(value), str(e)) from e


def _replace(obj: S, path: list[str], value: object) -> S:
    head, *rest = path
    new = _replace(getattr(obj, head), rest, value) if rest else value
    return dataclasses.replace(obj, **{head: new})  # type: ignore[type-var]


def _get(obj: object, field: str) -> Any:
    for part in field.split("."):
        obj = getattr(obj, part)
    return obj
