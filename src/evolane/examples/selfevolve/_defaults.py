"""Defaults shared by the CLI and the optimizer, in a module that imports nothing."""

FAULT_RATES = {"noop": 0.05, "malformed": 0.05, "oversized": 0.03, "tamper": 0.05}
"""How often the example optimizer returns a no-op, a malformed or oversized skill, or a
tampering edit of a protected file instead of a rule change."""
