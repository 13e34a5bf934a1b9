"""Test-support code: a deterministic generator of synthetic Kineto traces with planted facts."""
