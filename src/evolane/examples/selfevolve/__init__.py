"""The self-evolution decision benchmark: should a session's lesson be persisted, and how?

A small, honest, deterministic workload for `evolane optimize --example self-evolution`:
session traces from eight template families, a rule-engine agent that follows SKILL.md,
an exact judge, and an optimizer whose edits help, hurt, change nothing, or break gates.
"""

from evolane.examples.selfevolve._workspace import commands, write_workspace

__all__ = ["commands", "write_workspace"]
