"""One declaration per setting: parsing with the variable named, defaults, flags and their help."""

from __future__ import annotations

import argparse
import dataclasses
import re

import pytest

from collscope.nodeagent import envsettings, errors, settings


@dataclasses.dataclass(frozen=True)
class Inner:
    port: int = 80

    def __post_init__(self) -> None:
        if self.port == 13:
            raise ValueError("unlucky")


@dataclasses.dataclass(frozen=True)
class Config:
    name: str = "x"
    interval_s: float = 0.5
    inner: Inner = Inner()


VARS = (
    envsettings.Var("T_NAME", envsettings.text, "a name", "name", flag="--name"),
    envsettings.Var(
        "T_INTERVAL_S", envsettings.number(positive=True), "seconds", "interval_s", flag="--every"
    ),
    envsettings.Var("T_PORT", envsettings.integer(0, 65535), "a port", "inner.port", flag="--port"),
)


def test_unset_and_empty_keep_the_default_and_set_ones_land_in_their_field() -> None:
    assert envsettings.load(Config(), VARS, {"T_NAME": "", "T_PORT": " "}) == Config()
    c = envsettings.load(Config(), VARS, {"T_NAME": " y ", "T_PORT": "8", "T_INTERVAL_S": "2"})
    assert c == Config(name="y", interval_s=2.0, inner=Inner(port=8))


@pytest.mark.parametrize(
    ("name", "raw", "reason"),
    [
        ("T_PORT", "x", "not an integer"),
        ("T_PORT", "70000", r"must be in \[0, 65535\]"),
        ("T_INTERVAL_S", "0", "must be > 0"),
        ("T_INTERVAL_S", "nan", "must be finite"),
        ("T_PORT", "13", "unlucky"),  # the field's own check, reported as the variable's
    ],
)
def test_a_bad_value_names_the_variable_and_the_value(name: str, raw: str, reason: str) -> None:
    with pytest.raises(errors.SettingsError, match=f"^{name}='{raw}': {reason}") as e:
        envsettings.load(Config(), VARS, {name: raw})
    assert (e.value.name, e.value.value) == (name, raw)


def test_required_keep_empty_and_values() -> None:
    need = envsettings.Var("T_NEED", envsettings.text, "", "name", required=True, hint=" (why)")
    with pytest.raises(errors.SettingsError, match=r"^T_NEED: not set \(why\)$"):
        envsettings.values({}, [need, *VARS])
    empty = envsettings.Var("T_NAME", envsettings.text, "", "name", keep_empty=True)
    assert envsettings.load(Config(), [empty], {"T_NAME": ""}).name == ""
    assert envsettings.load(Config(), [empty], {}).name == "x"
    assert envsettings.values({"T_PORT": "9"}, VARS) == {"inner.port": 9}


def test_flags_show_variable_and_default_and_override_checked() -> None:
    p = argparse.ArgumentParser()
    for var in VARS:
        envsettings.add_flag(p, var, Config())
    helps = {a.dest: a.help for a in p._actions}
    assert helps["every"] == "seconds (T_INTERVAL_S; default: 0.5)"
    assert helps["port"] == "a port (T_PORT; default: 80)"
    base = envsettings.load(Config(), VARS, {"T_PORT": "8"})
    assert envsettings.overrides(base, VARS, p.parse_args([])) == base
    got = envsettings.overrides(base, VARS, p.parse_args(["--every", "3", "--name", "z"]))
    assert got == Config(name="z", interval_s=3.0, inner=Inner(port=8))
    with pytest.raises(errors.SettingsError, match=r"^--every='-1\.0': must be > 0"):
        envsettings.overrides(base, VARS, p.parse_args(["--every", "-1"]))
    with pytest.raises(SystemExit):  # argparse's own conversion: a usage error, exit 2
        p.parse_args(["--port", "eighty"])


def test_choice() -> None:
    level = envsettings.choice("DEBUG", "INFO", fold=str.upper)
    assert level("debug") == "DEBUG"
    with pytest.raises(ValueError, match="must be DEBUG or INFO"):
        level("loud")


def test_the_agents_docstring_lists_every_variable_it_reads() -> None:
    assert settings.__doc__ is not None
    listed = set(re.findall(r"^    ((?:COLLSCOPE_|NODE_)[A-Z_]+)", settings.__doc__, re.M))
    assert listed == {v.env for v in settings.VARIABLES}
    fields = [v.field for v in settings.VARIABLES]
    assert len(set(fields)) == len(fields)
