"""The decision agent under optimisation: reads a trace, follows SKILL.md, answers in JSON.

Reading the trace is fixed code (what any agent would notice); what it decides, which
events it cites and how it words the lesson all come from the skill.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from evolane.examples.selfevolve._skill import Skill

_LINE = re.compile(r"^\[(?P<id>ev-[0-9a-f]{4})\] t=(?P<t>\d+) (?P<role>\w+): (?P<text>.*)$")
_REQUEST = re.compile(r"^please (?P<task>.+) for the (?P<project>\w+) project$")
UNSAFE_MARKERS = ("rm -rf", "sudo ", "| sh", "--force", "chmod -R 777", "--no-hooks")


@dataclass(frozen=True)
class Event:
    """One line of the trace."""

    id: str
    t: int
    role: str
    text: str


def parse_trace(trace: str) -> list[Event]:
    """Events in time order (display order is shuffled); unknown lines are ignored."""
    events = []
    for line in trace.splitlines():
        match = _LINE.match(line.strip())
        if match:
            events.append(Event(match["id"], int(match["t"]), match["role"], match["text"]))
    return sorted(events, key=lambda event: event.t)


class Reading:
    """What the trace says: the task at hand, its facts, and groups of events."""

    def __init__(self, events: list[Event]) -> None:
        self.events = events
        request = next((_REQUEST.match(e.text) for e in events if _REQUEST.match(e.text)), None)
        self.task = request["task"] if request else ""
        self.project = request["project"] if request else ""
        task = self.task or "\0"
        outcomes = [e for e in events if e.role == "outcome"]
        self.groups = {
            "task_successes_verified": [
                e for e in outcomes if e.text.startswith(f"{task} succeeded; verified by ")
            ],
            "task_successes": [
                e for e in outcomes if e.text.startswith((f"{task} succeeded", f"{task} appears"))
            ],
            "all_successes": [e for e in outcomes if " succeeded" in e.text],
            "failures": [
                e
                for e in outcomes
                if e.text.startswith(f"{task} failed") or f"broke {task}" in e.text
            ],
            "fix": [
                e
                for e in outcomes
                if e.text.startswith(f"{task} succeeded after the fix")
                or e.text.startswith(f"rollback of {task} verified")
            ],
            "preferences": [e for e in events if e.role == "user" and " I prefer " in e.text],
            "confirmations": [
                e for e in events if e.role == "user" and e.text.startswith("yes, keep")
            ],
            "contradictions": [e for e in events if e.role == "user" and "never mind" in e.text],
            "injection": [e for e in events if "IGNORE ALL PREVIOUS INSTRUCTIONS" in e.text],
            "unverified": [e for e in outcomes if e.text.startswith(f"{task} appears done")],
            "everything": list(events),
            "nothing": [],
        }
        g = self.groups
        self.features = {
            "successes_verified": len(g["task_successes_verified"]),
            "successes_any": len(g["task_successes"]),
            "unverified": len(g["unverified"]),
            "known_skill": sum("used skill" in e.text for e in events if e.role == "assistant"),
            "failures": len(g["failures"]),
            "fix_verified": sum(e.text.startswith(f"{task} succeeded after") for e in g["fix"]),
            "rollback_verified": sum(e.text.startswith("rollback of") for e in g["fix"]),
            "preference": len(g["preferences"]),
            "preference_confirmed": len(g["confirmations"]),
            "preference_contradicted": len(g["contradictions"]),
            "injection": len(g["injection"]),
        }

    def placeholders(self, reason: str) -> dict[str, str]:
        own = self.groups["task_successes_verified"] + self.groups["fix"]
        signal = own[-1].text.split(" verified by ", 1)[1] if own else ""
        topic = (
            self.groups["preferences"][0].text.split(" I prefer ", 1)[1]
            if self.groups["preferences"]
            else ""
        )
        return {
            "task": self.task,
            "project": self.project,
            "verify_signal": signal,
            "topic": topic,
            "reason": reason,
        }

    def steps(self, policy: str) -> list[str]:
        if policy == "none":
            return []
        found: list[str] = []
        for event in self.events:
            if event.role == "tool" and event.text.startswith("ran "):
                step = event.text[4:]
                unsafe = any(marker in step for marker in UNSAFE_MARKERS)
                if step not in found and not (unsafe and policy.endswith("skip unsafe")):
                    found.append(step)
        return found[:8]


def decide(skill: Skill, trace: str) -> dict:
    """The agent's answer for one trace, following ``skill``."""
    reading = Reading(parse_trace(trace))
    rule = next((r for r in skill.rules if r.matches(reading.features)), None)
    action, reason = (rule.action, rule.reason) if rule else ("none", "")
    values = reading.placeholders(reason)
    answer: dict = {"action": action}
    for name in ("trigger", "verification", "exception"):
        template = skill.fields.get((action, name), "")
        answer[name] = template.format_map(values) if template else ""
    cited: list[str] = []
    for selector in skill.evidence.get(action, ("nothing",)):
        cited += [e.id for e in reading.groups[selector] if e.id not in cited]
    answer["evidence"] = cited
    answer["steps"] = reading.steps(skill.steps) if action in ("create", "refine") else []
    return answer
