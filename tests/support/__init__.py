"""Test-support code (not installed): the deterministic synthetic Kineto trace generator and the one
hand-built event builder the tests share. Tests import it as ``support`` (pytest puts ``tests/`` on
``sys.path``); scripts add ``tests/`` to ``sys.path`` first."""
