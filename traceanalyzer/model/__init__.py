"""Typed, columnar models built by the loaders; the only input analyses see."""

from typing import TypeAlias

from traceanalyzer.model.memory import MemoryTimelineModel, SnapshotModel
from traceanalyzer.model.trace import SCHEMAS, TraceMeta, TraceModel, empty_table

#: Every kind of model (its ``kind``: ``"trace"``, ``"snapshot"``, ``"memory_timeline"``).
Model: TypeAlias = TraceModel | SnapshotModel | MemoryTimelineModel

#: Each kind of input in words, one and many, for the lines users read ("needs steps (from a
#: profiler trace)", "holds memory snapshots, the baseline profiler traces").
KIND_WORDS: dict[str, tuple[str, str]] = {
    "trace": ("a profiler trace", "profiler traces"),
    "snapshot": ("a memory snapshot", "memory snapshots"),
    "memory_timeline": ("an export_memory_timeline file", "export_memory_timeline files"),
}

__all__ = ["KIND_WORDS", "SCHEMAS", "MemoryTimelineModel", "Model", "SnapshotModel", "TraceMeta", "TraceModel",
           "empty_table"]
