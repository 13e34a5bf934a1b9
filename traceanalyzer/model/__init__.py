"""Typed, columnar models built by the loaders; the only input analyses see."""

from typing import TypeAlias

from traceanalyzer.model.memory import MemoryTimelineModel, SnapshotModel
from traceanalyzer.model.trace import SCHEMAS, TraceMeta, TraceModel, empty_table

#: Every kind of model (its ``kind``: ``"trace"``, ``"snapshot"``, ``"memory_timeline"``).
Model: TypeAlias = TraceModel | SnapshotModel | MemoryTimelineModel

__all__ = ["SCHEMAS", "MemoryTimelineModel", "Model", "SnapshotModel", "TraceMeta", "TraceModel", "empty_table"]
