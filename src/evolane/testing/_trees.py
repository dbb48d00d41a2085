"""Hostile process trees for tests and benchmarks of the sandbox (plain ``sh`` programs)."""

from __future__ import annotations

EVIL_TREE_SH = r"""
# ~50 processes that fight the kill ladder.
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do (trap '' TERM; sleep 1000) & done   # TERM ignored
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do sleep 1000 & done                   # plain
for i in 1 2 3 4 5; do (trap 'sleep 1000 & sleep 1000 &' TERM; while :; do sleep 1; done) & done
setsid sh -c 'trap "" TERM; sleep 1000' &                                    # new session
(setsid sh -c '(trap "" TERM; exec sleep 1000) & exit 0' &)                  # double fork + setsid
trap '' TERM
echo ready
wait
"""
"""A tree of ~50 processes: TERM-ignorers, a double-fork + setsid escaper, and children that
fork again on SIGTERM. Prints ``ready`` once everything is started."""

POLITE_TREE_SH = r"""
for i in 1 2 3 4 5 6 7 8 9 10; do sleep 1000 & done
echo ready
wait
"""
"""Ten sleepers under a shell: every process dies on SIGTERM."""

DAEMON_AFTER_EXIT_SH = r"""
(trap '' TERM; sleep 1000) &
setsid sleep 1000 &
echo started
exit 0
"""
"""Exits 0 at once, leaving a TERM-ignoring child and a setsid daemon holding the pipes."""
