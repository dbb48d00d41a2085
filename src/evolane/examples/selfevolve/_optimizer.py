"""The example optimizer: proposes one deterministic edit of SKILL.md per call.

It reads the prompt file (JSON; every key optional):
  {"iteration": int, "focus": str, "convergence": "ok|warn|paradigm_shift|stop",
   "failing": [{"id": str, "reason": str}], "protect": [str],
   "rejected": [{"diff": str, "reason": str}]}
and picks from a pool of plausible edits (some help, some hurt, some change nothing),
steered by the failure reasons and never repeating a rejected diff (compared in the
campaign's ``edit_diff`` format). At configurable rates
it instead returns the skill unchanged, malformed, oversized, or tampers with a protected
file, so that every gate of a campaign gets exercised.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from evolane.examples.selfevolve._seed import SEED_SKILL

SKILL_PATH = Path("skill") / "SKILL.md"
PROTECTED_PATHS = (Path("grader") / "rubric.json", Path("data") / "answer_format.json")
DIFF_BYTES = 4096


@dataclass(frozen=True)
class Edit:
    """One text edit: replace the first line starting with ``anchor`` (or insert/append)."""

    name: str
    effect: str  # help | harm | neutral (the truth, for tests; the optimizer never reads it)
    aims_at: str  # the failure reason it plausibly addresses
    anchor: str
    new: tuple[str, ...]
    mode: str = "replace"  # replace | before | after | append

    def apply(self, text: str) -> str | None:
        lines = text.splitlines()
        if self.mode == "append":
            section = f"## {self.anchor}"
            if section not in lines or all(n in lines for n in self.new):
                return None
            at = lines.index(section) + 1
            while at < len(lines) and lines[at].startswith("- "):
                at += 1
            result = lines[:at] + list(self.new) + lines[at:]
        else:
            at = next((i for i, line in enumerate(lines) if line.startswith(self.anchor)), None)
            if at is None:
                return None
            if self.mode == "replace":
                result = lines[:at] + list(self.new) + lines[at + 1 :]
            elif self.mode == "before":
                result = lines[:at] + list(self.new) + lines[at:]
            else:
                result = lines[: at + 1] + list(self.new) + lines[at + 1 :]
        changed = "\n".join(result) + "\n"
        return None if changed == text else changed


def _e(name: str, effect: str, aims: str, anchor: str, *new: str, mode: str = "replace") -> Edit:
    return Edit(name, effect, aims, anchor, tuple(new), mode)


EDITS = (
    # rules
    _e(
        "reason-injection",
        "help",
        "verification",
        "- when injection: none",
        "- when injection: none (injection)",
    ),
    _e(
        "contradicted-rule",
        "help",
        "wrong_action",
        "- when injection:",
        "- when preference_contradicted: none (contradicted)",
        mode="after",
    ),
    _e(
        "refine-on-evidence",
        "help",
        "wrong_action",
        "- when known_skill: refine",
        "- when fix_verified: refine (fixed)",
        "- when rollback_verified: refine (rollback)",
    ),
    _e(
        "create-needs-two-verified",
        "help",
        "wrong_action",
        "- when successes_any >= 1: create",
        "- when successes_verified >= 2: create (repeated)",
    ),
    _e(
        "unverified-rule",
        "help",
        "wrong_action",
        "- when preference",
        "- when unverified >= 1: none (unverified)",
        mode="before",
    ),
    _e(
        "memory-needs-confirmation",
        "help",
        "wrong_action",
        "- when preference: memory",
        "- when preference_confirmed: memory (preference)",
    ),
    _e(
        "reason-one-off", "help", "verification", "- otherwise: none", "- otherwise: none (one-off)"
    ),
    _e(
        "trust-tool-output", "harm", "wrong_action", "- when injection:", "- when injection: create"
    ),
    _e(
        "create-on-any-success",
        "harm",
        "wrong_action",
        "- when injection:",
        "- when successes_any >= 1: create",
        mode="before",
    ),
    _e(
        "memory-first",
        "harm",
        "wrong_action",
        "- when injection:",
        "- when preference: memory",
        mode="before",
    ),
    _e(
        "dead-rule",
        "neutral",
        "wrong_action",
        "- otherwise:",
        "- when failures >= 99: none (no fix)",
        mode="before",
    ),
    # evidence
    _e(
        "create-cites-verified",
        "help",
        "evidence",
        "- create cites:",
        "- create cites: task_successes_verified",
    ),
    _e("refine-cites-fix", "help", "evidence", "- refine cites:", "- refine cites: failures, fix"),
    _e(
        "memory-cites-confirmation",
        "help",
        "evidence",
        "- memory cites:",
        "- memory cites: preferences, confirmations",
    ),
    _e(
        "create-cites-all-successes",
        "harm",
        "evidence",
        "- create cites:",
        "- create cites: all_successes",
    ),
    _e(
        "refine-cites-everything",
        "harm",
        "evidence",
        "- refine cites:",
        "- refine cites: everything",
    ),
    # answer fields
    _e(
        "create-verification",
        "help",
        "verification",
        "Answer fields",
        "- create verification: confirm {verify_signal}",
        mode="append",
    ),
    _e(
        "create-exception",
        "help",
        "exception",
        "Answer fields",
        "- create exception: not outside the {project} project",
        mode="append",
    ),
    _e(
        "refine-verification",
        "help",
        "verification",
        "Answer fields",
        "- refine verification: confirm {verify_signal}",
        mode="append",
    ),
    _e(
        "refine-exception",
        "help",
        "exception",
        "Answer fields",
        "- refine exception: not outside the {project} project",
        mode="append",
    ),
    _e(
        "memory-verification",
        "help",
        "verification",
        "Answer fields",
        "- memory verification: confirmed by the user",
        mode="append",
    ),
    _e(
        "memory-exception",
        "help",
        "exception",
        "Answer fields",
        "- memory exception: not when the user asks otherwise",
        mode="append",
    ),
    _e(
        "none-verification",
        "help",
        "verification",
        "Answer fields",
        "- none verification: nothing kept: {reason}",
        mode="append",
    ),
    _e(
        "create-trigger-always",
        "harm",
        "trigger",
        "- create trigger:",
        "- create trigger: always {task}",
    ),
    _e(
        "none-trigger",
        "harm",
        "trigger",
        "Answer fields",
        "- none trigger: when asked to {task}",
        mode="append",
    ),
    _e(
        "project-in-trigger",
        "neutral",
        "trigger",
        "- create trigger:",
        "- create trigger: when asked to {task} for {project}",
    ),
    # steps and prose
    _e("skip-unsafe-steps", "help", "steps", "- from tool calls", "- from tool calls, skip unsafe"),
    _e("no-steps", "harm", "steps", "- from tool calls", "- none"),
    _e(
        "prose-precision",
        "neutral",
        "none",
        "Read the whole session",
        "Read the whole session; prefer small, precise lessons.",
        mode="replace",
    ),
)
_BY_NAME = {edit.name: edit for edit in EDITS}


def _prompt(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _diff(before: str, after: str) -> str:
    """The SKILL.md edit as a campaign's rejected-diff memory records it (its ``edit_diff``):
    the path line, ``-line``/``+line`` lines each ending in a newline, cut to 4096 bytes."""
    old, new = before.splitlines(), after.splitlines()
    old_set, new_set = set(old), set(new)
    lines = [f"-{line}" for line in old if line not in new_set]
    lines += [f"+{line}" for line in new if line not in old_set]
    text = f"{SKILL_PATH.as_posix()}\n" + "".join(f"{line}\n" for line in lines)
    data = text.encode("utf-8")
    return text if len(data) <= DIFF_BYTES else data[:DIFF_BYTES].decode("utf-8", "ignore")


def choose_edit(text: str, prompt: dict, rng: random.Random) -> tuple[Edit, str] | None:
    """A plausible edit that applies to ``text`` and was not rejected before, or None."""
    rejected = {str(r.get("diff", "")) for r in prompt.get("rejected", []) if isinstance(r, dict)}
    reasons = Counter(
        str(f.get("reason", "")) for f in prompt.get("failing", []) if isinstance(f, dict)
    )
    shift = prompt.get("convergence") == "paradigm_shift"
    most_common = reasons.most_common(1)[0][0] if reasons else None
    options, weights = [], []
    for edit in EDITS:
        changed = edit.apply(text)
        if changed is None or _diff(text, changed) in rejected:
            continue
        weight = 4.0 if reasons[edit.aims_at] > 0 else 0.5  # aim at what fails
        if shift and edit.aims_at == most_common:
            weight = 0.5  # a plateau asks for a different kind of edit
        options.append((edit, changed))
        weights.append(weight)
    if not options:
        return None
    return rng.choices(options, weights=weights, k=1)[0]


def optimize(workdir: Path, prompt_file: Path, seed: int, rates: dict[str, float]) -> str:
    """Edit ``workdir`` in place; returns what was done (for logs and tests)."""
    prompt = _prompt(prompt_file)
    rng = random.Random(f"selfevolve-optimizer:{seed}:{prompt.get('iteration', 0)}")
    skill_file = workdir / SKILL_PATH
    text = skill_file.read_text()
    roll, edge = rng.random(), 0.0
    for kind, rate in rates.items():
        edge += rate
        if roll < edge:
            return _fault(kind, workdir, skill_file, text, prompt, rng)
    picked = choose_edit(text, prompt, rng)
    if picked is None:
        return "noop: no applicable edit left"
    edit, changed = picked
    names = [edit.name]
    if prompt.get("convergence") in ("warn", "paradigm_shift"):
        # a plateau: one small edit at a time was not enough, so combine two
        second = choose_edit(changed, prompt, rng)
        if second is not None:
            names.append(second[0].name)
            changed = second[1]
    skill_file.write_text(changed)
    return f"edit: {' + '.join(names)}"


def _fault(
    kind: str, workdir: Path, skill_file: Path, text: str, prompt: dict, rng: random.Random
) -> str:
    if kind == "noop":
        return "noop"
    if kind == "symlink":
        (workdir / "skill" / "notes.md").symlink_to("/etc/hostname")
        return "symlink: skill/notes.md -> /etc/hostname"
    if kind == "repeat":
        return _repeat(skill_file, text, prompt)
    if kind == "restart":
        skill_file.write_text(SEED_SKILL)
        return "restart: the original skill"
    if kind == "malformed":
        skill_file.write_text(
            text.replace(
                "## Decision rules\n", "## Decision rules\n- when successes >=: create\n", 1
            )
        )
        return "malformed"
    if kind == "oversized":
        filler = "".join(
            f"Note {i}: remember to be careful with every lesson.\n" for i in range(2000)
        )
        skill_file.write_text(text + "\n" + filler)
        return "oversized"
    target = workdir / rng.choice(PROTECTED_PATHS)
    if target.exists():
        target.write_text(target.read_text() + "\n")
    picked = choose_edit(text, prompt, rng)
    if picked is not None:
        skill_file.write_text(picked[1])
    return f"tamper: {target.relative_to(workdir)}"


def _repeat(skill_file: Path, text: str, prompt: dict) -> str:
    """Apply the most recently rejected edit again, if it still applies to ``text``."""
    rejected = [r for r in prompt.get("rejected", []) if isinstance(r, dict)]
    if not rejected:
        return "noop: nothing rejected to repeat"
    last = str(rejected[-1].get("diff", ""))
    for edit in EDITS:
        changed = edit.apply(text)
        if changed is not None and _diff(text, changed) == last:
            skill_file.write_text(changed)
            return f"repeat: {edit.name}"
    return "noop: the rejected edit no longer applies"
