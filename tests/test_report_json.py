"""summary.json: golden file on a synthetic trace, schema validation, stability.

Regenerate the golden file after an intended change with
``UPDATE_GOLDEN=1 pytest tests/test_report_json.py`` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from report_support import synthetic_report

from traceanalyzer import __version__
from traceanalyzer.report.document import JSON_SCHEMA_VERSION
from traceanalyzer.report.json_report import dumps, round_floats, summary

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden" / "summary.json"
SCHEMA = REPO / "docs" / "summary.schema.json"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return synthetic_report(tmp_path_factory.mktemp("json"))


def normalise(data: bytes) -> bytes:
    """What may legitimately differ between releases: the tool version."""
    return data.replace(f'"version": "{__version__}"'.encode(), b'"version": "<version>"')


def compare_golden(actual: bytes, golden: Path) -> None:
    if os.environ.get("UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(actual)
        return
    assert golden.exists(), f"{golden} is missing: run UPDATE_GOLDEN=1 pytest {Path(__file__).name}"
    expected = golden.read_bytes()
    if actual != expected:
        a, e = actual.decode().splitlines(), expected.decode().splitlines()
        first = next((i for i, (x, y) in enumerate(zip(a, e)) if x != y), min(len(a), len(e)))
        context = "\n".join(f"  line {i + 1}: got {a[i]!r}\n          want {e[i]!r}"
                            for i in range(first, min(first + 3, len(a), len(e))))
        pytest.fail(f"{golden.name} differs from line {first + 1} ({len(a)} vs {len(e)} lines):\n{context}\n"
                    f"If the change is intended: UPDATE_GOLDEN=1 pytest {Path(__file__).name}")


def test_summary_json_matches_golden(report: Any) -> None:
    compare_golden(normalise(dumps(report) + b"\n"), GOLDEN)


def test_summary_json_is_deterministic_and_machine_independent(report: Any, tmp_path: Path) -> None:
    again = synthetic_report(tmp_path)  # another directory, another run
    assert dumps(again) == dumps(report)
    text = dumps(report).decode()
    assert str(tmp_path) not in text and str(tmp_path.parent) not in text
    assert report.meta["path"] == "synthetic.json"


def test_floats_are_rounded_and_non_finite_become_null() -> None:
    assert round_floats({"a": [0.1 + 0.2, 1 / 3], "b": float("nan"), "c": (float("inf"), 7), "d": "x"}) == {
        "a": [0.3, 0.3333333333], "b": None, "c": [None, 7], "d": "x"}


def test_top_level_layout(report: Any) -> None:
    doc = summary(report)
    assert doc["schema_version"] == JSON_SCHEMA_VERSION
    assert re.fullmatch(r"\d+\.\d+", doc["schema_version"])
    assert doc["tool"] == {"name": "traceanalyzer", "version": __version__}
    assert doc["kind"] == "trace"
    # every analysis that ran is there, with the numbers its result holds
    assert set(doc["analyses"]) == set(report.results.values)
    assert doc["analyses"]["steps"]["n_steps"] == 3
    assert doc["analyses"]["kernels"]["n_kernels"] == report.results["kernels"].n_kernels
    assert len(doc["findings"]) == len(report.findings)


# ---------------------------------------------------------------------------------------------
# Schema: docs/summary.schema.json (JSON Schema draft 2020-12)
# ---------------------------------------------------------------------------------------------


def test_summary_validates_against_schema_with_jsonschema(report: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = orjson.loads(SCHEMA.read_bytes())
    jsonschema.Draft202012Validator.check_schema(schema)
    doc = orjson.loads(dumps(report))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors[:10])


def _validate(inst: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "$") -> list[str]:
    """A small validator for the subset of draft 2020-12 the schema uses (the test runs
    even where the ``jsonschema`` package is not installed)."""
    if "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), ref
        return _validate(inst, root["$defs"][ref.split("/")[-1]], root, path)
    errs: list[str] = []
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else types
        checks = {
            "object": lambda v: isinstance(v, dict), "array": lambda v: isinstance(v, list),
            "string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "null": lambda v: v is None,
        }
        if not any(checks[n](inst) for n in names):
            return [f"{path}: {type(inst).__name__} is not {names}"]
    if "const" in schema and inst != schema["const"]:
        errs.append(f"{path}: {inst!r} != {schema['const']!r}")
    if "enum" in schema and inst not in schema["enum"]:
        errs.append(f"{path}: {inst!r} not in {schema['enum']}")
    if "pattern" in schema and isinstance(inst, str) and not re.search(schema["pattern"], inst):
        errs.append(f"{path}: {inst!r} does not match {schema['pattern']}")
    if isinstance(inst, (int, float)) and not isinstance(inst, bool):
        if "minimum" in schema and inst < schema["minimum"]:
            errs.append(f"{path}: {inst} < {schema['minimum']}")
        if "maximum" in schema and inst > schema["maximum"]:
            errs.append(f"{path}: {inst} > {schema['maximum']}")
    if isinstance(inst, dict):
        for key in schema.get("required", []):
            if key not in inst:
                errs.append(f"{path}: missing {key!r}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, value in inst.items():
            if key in props:
                errs += _validate(value, props[key], root, f"{path}.{key}")
            elif extra is False:
                errs.append(f"{path}: unexpected key {key!r}")
            elif isinstance(extra, dict):
                errs += _validate(value, extra, root, f"{path}.{key}")
    if isinstance(inst, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(inst):
            errs += _validate(value, schema["items"], root, f"{path}[{i}]")
    if "anyOf" in schema and all(_validate(inst, s, root, path) for s in schema["anyOf"]):
        errs.append(f"{path}: matches none of anyOf")
    return errs


def test_summary_validates_against_schema_builtin(report: Any) -> None:
    schema = orjson.loads(SCHEMA.read_bytes())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["properties"]["schema_version"]["const"] == JSON_SCHEMA_VERSION
    errors = _validate(orjson.loads(dumps(report)), schema, schema)
    assert not errors, "\n".join(errors[:10])


def test_schema_rejects_a_broken_summary(report: Any) -> None:
    schema = orjson.loads(SCHEMA.read_bytes())
    doc = orjson.loads(dumps(report))
    doc["schema_version"] = "0.9"
    del doc["findings"]
    errors = _validate(doc, schema, schema)
    assert any("schema_version" in e for e in errors) and any("findings" in e for e in errors)
