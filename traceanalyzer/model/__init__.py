"""Typed, columnar models built by the loaders; the only input analyses see."""

from traceanalyzer.model.trace import SCHEMAS, TraceMeta, TraceModel, empty_table

__all__ = ["SCHEMAS", "TraceMeta", "TraceModel", "empty_table"]
