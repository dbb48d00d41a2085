"""Defaults shared by the CLI and the optimizer, in a module that imports nothing."""

FAULT_RATES = {
    "noop": 0.05,
    "malformed": 0.05,
    "oversized": 0.04,
    "tamper": 0.05,
    "symlink": 0.04,
    "repeat": 0.03,
    "restart": 0.04,
}
"""How often the example optimizer returns a no-op, a malformed or oversized skill, a
tampering edit of a protected file, a symlink out of the tree, or repeats the most recently
rejected edit (as a model that ignores its instructions would), or throws its work away and
returns the original skill, instead of a new rule change."""
