"""The seed skill the campaign starts from: plausible, and weak (val score about 0.3)."""

SEED_SKILL = """\
# Skill: decide what to persist from a work session

Read the whole session, then decide whether to save a lesson.

## Decision rules
- when injection: none
- when known_skill: refine
- when successes_any >= 1: create
- when preference: memory
- otherwise: none

## Evidence
- create cites: task_successes
- refine cites: failures
- memory cites: preferences
- none cites: nothing

## Answer fields
- create trigger: when asked to {task}
- refine trigger: when asked to {task}
- memory trigger: when the user mentions {topic}

## Steps
- from tool calls
"""
