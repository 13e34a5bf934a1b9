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

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from traceanalyzer.errors import ConfigError

T = TypeVar("T", int, float, str, bool)


@dataclass(frozen=True)
class Config:
    """An immutable bag of dotted-key overrides; defaults live with their readers."""

    overrides: dict[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: T) -> T:
        """The value for ``key`` converted to the type of ``default``."""
        if key not in self.overrides:
            return default
        value = self.overrides[key]
        try:
            if isinstance(default, bool):
                if isinstance(value, str):
                    return value.strip().lower() in ("1", "true", "yes", "on")  # type: ignore[return-value]
                return bool(value)  # type: ignore[return-value]
            return type(default)(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a {type(default).__name__}, got {value!r}") from None

    def with_overrides(self, more: dict[str, Any]) -> "Config":
        return Config({**self.overrides, **more})

    @classmethod
    def from_file(cls, path: str | Path) -> "Config":
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
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
