"""The phases of a training step, as the ``phases`` and ``diagnosis`` analyses name them
(private to the analyses package)."""

from __future__ import annotations

PHASES: tuple[str, ...] = ("data_loading", "forward", "backward", "optimizer", "communication", "other")


USER_DATA_RE = r"(?i)data_?load|load_?batch|get_?batch|next_?batch|prefetch"
