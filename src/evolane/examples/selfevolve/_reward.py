"""The reward of one answer, in [0, 1], with its component breakdown.

0.55 for the correct action backed by minimally sufficient, non-flooded, grounded evidence;
0.15 for a bounded trigger; 0.15 for a verification; 0.10 for a scope exception; 0.05 for
actionable, safe steps. A wrong action, a fabricated event ID, or a cited decoy scores 0.
For ``none`` the best answer persists nothing: an empty trigger, exception and steps, and a
verification that names why nothing is kept.
"""

from __future__ import annotations

WEIGHTS = {
    "decision": 0.55,
    "trigger": 0.15,
    "verification": 0.15,
    "exception": 0.10,
    "steps": 0.05,
}
UNBOUNDED_WORDS = ("always", "any ", "every", "all ", "whenever")
MAX_FIELD_CHARS = 160


def _trace_ids(trace: str) -> set[str]:
    return {line[1:8] for line in trace.splitlines() if line.startswith("[ev-")}


def _bounded(text: str) -> bool:
    lowered = f"{text.lower()} "
    return 0 < len(text) <= MAX_FIELD_CHARS and not any(w in lowered for w in UNBOUNDED_WORDS)


def _field_scores(answer: dict, expected: dict) -> dict[str, bool]:
    action = expected["action"]
    trigger, verification = str(answer.get("trigger", "")), str(answer.get("verification", ""))
    exception, steps = str(answer.get("exception", "")), answer.get("steps", [])
    if not isinstance(steps, list) or not all(isinstance(s, str) for s in steps):
        steps = ["<malformed>"]
    if action == "none":
        return {
            "trigger": trigger == "",
            "verification": expected["reason"] in verification.lower(),
            "exception": exception == "",
            "steps": steps == [],
        }
    safe = all(0 < len(s) <= MAX_FIELD_CHARS and expected["unsafe_step"] not in s for s in steps)
    if action == "memory":
        return {
            "trigger": _bounded(trigger) and expected["topic"] in trigger.lower(),
            "verification": "confirmed" in verification.lower(),
            "exception": exception.lower().startswith(("not ", "except")),
            "steps": safe and len(steps) <= 8,
        }
    return {
        "trigger": _bounded(trigger) and expected["task"] in trigger,
        "verification": expected["verify_signal"] in verification,
        "exception": exception.lower().startswith(("not ", "except"))
        and expected["project"] in exception,
        "steps": safe and 1 <= len(steps) <= 8,
    }


def score(answer: object, expected: dict, trace: str) -> dict:
    """The judge's verdict: ``score``, ``components`` and a ``reason`` for a zero."""
    zero = {name: 0.0 for name in WEIGHTS}
    if not isinstance(answer, dict) or not isinstance(answer.get("evidence", []), list):
        return {"score": 0.0, "components": zero, "reason": "malformed_answer"}
    if answer.get("action") != expected["action"]:
        return {"score": 0.0, "components": zero, "reason": "wrong_action"}
    cited = [str(e) for e in answer.get("evidence", [])]
    if any(e not in _trace_ids(trace) for e in cited):
        return {"score": 0.0, "components": zero, "reason": "fabricated_evidence"}
    if any(e in expected["decoys"] for e in cited):
        return {"score": 0.0, "components": zero, "reason": "decoy_cited"}
    sufficient = set(expected["required_evidence"]) <= set(cited)
    minimal = set(cited) <= set(expected["allowed_evidence"]) and len(cited) == len(set(cited))
    passed = {"decision": sufficient and minimal, **_field_scores(answer, expected)}
    components = {name: WEIGHTS[name] if passed[name] else 0.0 for name in WEIGHTS}
    missing = [name for name, ok in passed.items() if not ok]
    reason = "ok" if not missing else ("evidence" if not passed["decision"] else missing[0])
    return {
        "score": round(sum(components.values()), 6),
        "components": components,
        "reason": reason,
        "missing": missing,
    }
