"""Thresholds and settings, overridable from a TOML file and the command line.

Keys are dotted ``<owner>.<param>`` names, where the owner is an analysis name or a
rule id (e.g. ``idle_gaps.long_gap_us`` or ``low_gpu_utilization.min_busy_pct``).
Every analysis and rule reads its thresholds with :meth:`Config.get`, giving its
documented default; ``traceanalyzer rules`` lists them.

A config file is TOML with one table per owner::

    [idle_gaps]
    long_gap_us = 100

    [low_gpu_utilization]
    min_busy_pct = 70
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from traceanalyzer.errors import ConfigError

T = TypeVar("T", int, float, str, bool)

#: The largest magnitude a numeric setting may have. Thresholds are counts, µs, %, bytes
#: or ratios; anything beyond this is a typo and would overflow the 64-bit columns (or
#: turn into ``inf``) it is compared with.
MAX_ABS_VALUE = 1e15
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Config:
    """An immutable bag of dotted-key overrides; defaults live with their readers."""

    overrides: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: T) -> T:
        """The value for ``key`` converted to the type of ``default``.

        Raises :class:`ConfigError` (one line naming the key) for a value that does not
        convert, a non-finite number (``nan``, ``inf``) or one beyond :data:`MAX_ABS_VALUE`.
        """
        if key not in self.overrides:
            return default
        return convert(key, self.overrides[key], default)

    def with_overrides(self, more: dict[str, Any]) -> Config:
        return Config({**self.overrides, **more})

    @classmethod
    def from_file(cls, path: str | Path) -> Config:
        # Imported here: only a run with --config reads TOML (its regexes cost every run ~3 ms).
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # Python 3.10: the same parser, published as tomli (a dependency there)
            import tomli as tomllib

        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read the config file ({exc.strerror or exc})") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{p}: not valid TOML ({exc})") from None
        flat: dict[str, Any] = {}
        for owner, table in data.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{p}: top-level key {owner!r} must be a table like [{owner}]")
            for k, v in table.items():
                flat[f"{owner}.{k}"] = v
        return cls(flat)

    @staticmethod
    def parse_assignment(text: str) -> tuple[str, Any]:
        """Parse a CLI ``--set owner.param=value`` into (key, value)."""
        if "=" not in text or "." not in text.split("=", 1)[0]:
            raise ConfigError(f"--set {text!r}: expected OWNER.PARAM=VALUE, e.g. idle_gaps.long_gap_us=100")
        key, raw = text.split("=", 1)
        value: Any = raw
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        return key.strip(), value


class Params:
    """The parameters one owner (an analysis or a rule) declares, with the values in effect:
    each declared default overridden by the config key ``<owner>.<param>`` (converted and
    checked as :meth:`Config.get` does). ``params.x`` reads one; an undeclared name is an
    ``AttributeError`` (a typo must not read a silent default)."""

    def __init__(self, owner: str, defaults: Mapping[str, Any], config: Config) -> None:
        self._owner = owner
        self._values = {k: config.get(f"{owner}.{k}", v) for k, v in defaults.items()}

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_values"][name]
        except KeyError:
            raise AttributeError(f"{self.__dict__.get('_owner', '?')} declares no parameter {name!r}") from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)


def convert(key: str, value: Any, default: T) -> T:
    """``value`` converted to the type of ``default``, checked (see :meth:`Config.get`)."""
    name = type(default).__name__
    kind = "an integer" if name == "int" else f"a {name}"
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if isinstance(default, (int, float)):
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected {kind}, got {value!r}")
        try:
            number = float(value) if not isinstance(value, int) else value
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
        if isinstance(number, float) and not math.isfinite(number):
            raise ConfigError(f"{key}: expected a finite {'integer' if name == 'int' else name}, got {value!r}")
        if abs(number) > MAX_ABS_VALUE:
            raise ConfigError(f"{key}: {value!r} is out of range (at most {MAX_ABS_VALUE:.0e} in magnitude)")
        if isinstance(default, int):
            if isinstance(number, float) and not number.is_integer():
                raise ConfigError(f"{key}: expected an integer, got {value!r}")
            return int(number)
        return float(number)
    try:
        return type(default)(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: expected {kind}, got {value!r}") from None
