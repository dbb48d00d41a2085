"""SKILL.md: the structured rule list the decision agent follows, and its parser.

Sections (``## ...``) hold ``- `` items:
  Decision rules   ``when <cond>: <action> [(<reason>)]`` or ``otherwise: <action> [(<reason>)]``;
                   ``<cond>`` joins ``name``, ``not name``, ``name >= N`` with ``and``
  Evidence         ``<action> cites: <selector>[, <selector>...]``
  Answer fields    ``<action> <trigger|verification|exception>: <template>``
  Steps            ``from tool calls`` | ``from tool calls, skip unsafe`` | ``none``
Templates may use {task}, {project}, {verify_signal}, {topic} and {reason}.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field

ACTIONS = ("create", "refine", "memory", "none")
FEATURES = (
    "successes_verified",
    "successes_any",
    "unverified",
    "known_skill",
    "failures",
    "fix_verified",
    "rollback_verified",
    "preference",
    "preference_confirmed",
    "preference_contradicted",
    "injection",
)
SELECTORS = (
    "task_successes_verified",
    "task_successes",
    "all_successes",
    "failures",
    "fix",
    "preferences",
    "confirmations",
    "contradictions",
    "injection",
    "unverified",
    "everything",
    "nothing",
)
FIELDS = ("trigger", "verification", "exception")
STEP_POLICIES = ("from tool calls", "from tool calls, skip unsafe", "none")
MAX_SKILL_BYTES = 64 * 1024

_RULE = re.compile(
    r"^(?:when (?P<cond>.+)|otherwise): (?P<action>\w+)(?: \((?P<reason>[^()]*)\))?$"
)
_ATOM = re.compile(r"^(?P<neg>not )?(?P<name>\w+)(?: (?P<op>>=|<) (?P<n>\d+))?$")


class SkillError(ValueError):
    """A malformed SKILL.md; the message starts with ``SKILL.md:<line>:``."""


@dataclass(frozen=True)
class Condition:
    """One atom of a rule's condition."""

    name: str
    negated: bool = False
    op: str | None = None
    value: int = 0

    def holds(self, features: dict[str, int]) -> bool:
        actual = features[self.name]
        if self.op == ">=":
            result = actual >= self.value
        elif self.op == "<":
            result = actual < self.value
        else:
            result = actual > 0
        return result != self.negated


@dataclass(frozen=True)
class Rule:
    """``when`` conditions -> action (with an optional reason); no conditions = otherwise."""

    conditions: tuple[Condition, ...]
    action: str
    reason: str

    def matches(self, features: dict[str, int]) -> bool:
        return all(condition.holds(features) for condition in self.conditions)


@dataclass
class Skill:
    """The parsed skill: what the agent does with the features of a trace."""

    rules: list[Rule] = field(default_factory=list)
    evidence: dict[str, tuple[str, ...]] = field(default_factory=dict)
    fields: dict[tuple[str, str], str] = field(default_factory=dict)
    steps: str = "none"


def _fail(line: int, message: str) -> SkillError:
    return SkillError(f"SKILL.md:{line}: {message}")


PLACEHOLDERS = ("task", "project", "verify_signal", "topic", "reason")


def _check_template(template: str, line: int) -> None:
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as error:
        raise _fail(line, f"bad template {template!r}: {error}") from None
    unknown = [name for name in names if name not in PLACEHOLDERS]
    if unknown:
        raise _fail(line, f"unknown placeholder {{{unknown[0]}}}; use {', '.join(PLACEHOLDERS)}")


def _parse_rule(text: str, line: int) -> Rule:
    match = _RULE.match(text)
    if match is None:
        raise _fail(line, f"a rule must read 'when <cond>: <action>' or 'otherwise: ...': {text!r}")
    action = match["action"]
    if action not in ACTIONS:
        raise _fail(line, f"unknown action {action!r}; choose from {', '.join(ACTIONS)}")
    conditions = []
    for atom in (match["cond"] or "").split(" and ") if match["cond"] else []:
        parsed = _ATOM.match(atom.strip())
        if parsed is None or parsed["name"] not in FEATURES:
            raise _fail(line, f"unknown condition {atom.strip()!r}")
        conditions.append(
            Condition(parsed["name"], bool(parsed["neg"]), parsed["op"], int(parsed["n"] or 0))
        )
    return Rule(tuple(conditions), action, (match["reason"] or "").strip())


def _parse_item(skill: Skill, section: str, text: str, line: int) -> None:
    if section == "decision rules":
        skill.rules.append(_parse_rule(text, line))
    elif section == "evidence":
        head, _, tail = text.partition(" cites: ")
        selectors = tuple(s.strip() for s in tail.split(","))
        if head not in ACTIONS or not tail or any(s not in SELECTORS for s in selectors):
            raise _fail(line, f"evidence must read '<action> cites: <selector>, ...': {text!r}")
        skill.evidence[head] = selectors
    elif section == "answer fields":
        head, sep, template = text.partition(": ")
        action, _, name = head.partition(" ")
        if not sep or action not in ACTIONS or name not in FIELDS:
            raise _fail(line, f"a field must read '<action> <{'|'.join(FIELDS)}>: ...': {text!r}")
        _check_template(template, line)
        skill.fields[(action, name)] = template.strip()
    elif section == "steps":
        if text not in STEP_POLICIES:
            raise _fail(line, f"steps must be one of {', '.join(STEP_POLICIES)}: {text!r}")
        skill.steps = text
    else:
        raise _fail(line, f"item outside a known section: {text!r}")


def parse_skill(text: str) -> Skill:
    """Parse SKILL.md; raises `SkillError` naming the line of the first problem."""
    if len(text.encode()) > MAX_SKILL_BYTES:
        raise _fail(1, f"larger than {MAX_SKILL_BYTES} bytes")
    skill, section = Skill(), ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#!", "<!--")) or (line.startswith("# ")):
            continue
        if line.startswith("## "):
            section = line[3:].strip().lower()
            continue
        if not line.startswith("- "):
            if not section:
                continue  # prose before the first section is for people
            raise _fail(number, f"expected a '- ' item or a '## ' heading: {line!r}")
        _parse_item(skill, section, line[2:].strip(), number)
    if not skill.rules:
        raise _fail(1, "no decision rules")
    return skill
