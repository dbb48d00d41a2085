"""Online error control: the campaign-level rule for a campaign without a test split
(issue 16, DESIGN §6).

A campaign tests candidate after candidate on the same val cases, and each useless one
passes the val gate with some probability (about 16% at k = 1), so without a rule about
half of default campaigns end with a useless best. With no sealed test split to confirm the
best on, the ``online`` mode spends an error budget alpha = 1 - confidence over the
campaign's candidates with `stats.OnlineErrorControl` (the online fallback procedure):

- candidate i is accepted iff the gate accepts *and* the paired p-value of no true gain of
  its full val evaluation against its parent (`stats.online_p_value`) is <= level_i =
  alpha / H, plus
  the level of candidate i - 1 when that one was accepted;
- H, the horizon, is iterations x population x cycles, fixed when the budget is opened: the
  campaign can test no more candidates than that, so a finite horizon spends the whole budget
  evenly over them, where the unbounded sequence alpha / (i (i + 1)) would give the first
  candidate alpha / 2 and the sixteenth alpha / 272 (a later candidate, often the better one
  in a hill climb, would need a far smaller p-value);
- every candidate measured against its parent on val is recorded (a gate reject too: it
  spends its share), so the index of a candidate never depends on its own data.

Guarantee (strong familywise error control under any dependence: shared val cases, reused
baseline replays, hill-climbing): P(the campaign accepts any candidate that is no better than
its parent) <= alpha, hence P(it publishes an edit with no true gain over the seed) <= alpha,
however many candidates it tries. It assumes each p-value is valid: measurements never
accept early (`MeasureRequest.early_accept` is False; an early reject is fine), and the
candidates are not fitted to the val cases' outcomes (the optimizer's feedback comes from
train). The price is power: with level alpha / 16 = 0.0031, a candidate must improve at
least 9 val cases with none worse.

The p-values are valid only on pairs replayed in one window: a parent's val replays serve
every later candidate of a run (reused, or restored by a resume), and a world that drifts up
in between (an endpoint or a model judge that starts scoring higher) lifts every later
candidate alike. So a candidate the rule would accept on such pairs (`earlier_window`) is
measured again with both arms replayed anew (`MeasureRequest.fresh`) and decided on those
pairs alone (`RECHECKED` in its reason); a rejection keeps the reused baselines (a drift
down only makes a candidate look worse: power lost, no false accept).

The budget is durable: `OnlineBudget` is part of ``campaign.json`` (written atomically, after
the report); a cycle's tests derive from its journaled measurements, so a ``--resume`` of an
interrupted run derives the same tests again and a ``--resume-campaign`` continues the
stored budget: a campaign never gets a fresh alpha.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from evolane.campaign._config import CampaignConfig, ErrorControlMode
from evolane.messages import Decision, GateConfig, GateResult, Name, Record

if TYPE_CHECKING:  # the statistics (numpy) load where a campaign tests a candidate
    import numpy as np

    from evolane.stats import OnlineErrorControl

Mode = Literal["confirm", "online", "none"]
_MANY = 1_000_000
_LEVEL_TOLERANCE = 1e-12


def resolved_mode(mode: ErrorControlMode, test_cases: int) -> Mode:
    """The error control a campaign runs: ``auto`` is ``confirm`` with test cases, else
    ``online``; ``legacy`` (a run.json from before the setting) is ``confirm`` with test
    cases, else ``none``."""
    if mode == "auto":
        return "confirm" if test_cases else "online"
    if mode == "legacy":
        return "confirm" if test_cases else "none"
    return mode


class OnlineTest(Record):
    """One candidate tested under the online budget: its gate's decision, its p-value, the
    level it was tested at and the campaign's decision."""

    slot: Name
    index: int = Field(ge=1)
    gate: Decision
    p_value: float | None = Field(default=None, ge=0.0, le=1.0)
    """None when the gate did not accept: the gate decided, the p-value was not needed."""
    level: float = Field(ge=0.0, le=1.0)
    decision: Decision


class OnlineBudget(Record):
    """A campaign's error budget: ``alpha`` spent over ``horizon`` candidates, and every
    candidate tested so far (across cycles), in order."""

    alpha: float = Field(gt=0.0, lt=1.0)
    horizon: int = Field(ge=1)
    tests: tuple[OnlineTest, ...] = Field(default=(), max_length=_MANY)

    def control(self) -> OnlineErrorControl:
        """The procedure with every stored test recorded again: its levels, and each accept
        (a stored accept its p-value does not earn is refused: found by review, a one-word
        edit of campaign.json published an unconfirmed tree)."""
        from evolane.stats import OnlineErrorControl

        control = OnlineErrorControl(self.alpha, horizon=self.horizon)
        for test in self.tests:
            level = control.level_for_next()
            if abs(level - test.level) > _LEVEL_TOLERANCE * max(1.0, level):
                raise ValueError(
                    f"online budget: {test.slot} was tested at level {test.level:g}, but the "
                    f"stored history gives {level:g}"
                )
            p_value = 1.0 if test.p_value is None else test.p_value
            verdict = control.record(test.gate, p_value=p_value)
            if test.decision == "accept" and verdict.decision != "accept":
                raise ValueError(
                    f"online budget: {test.slot} is recorded as accepted, but its p-value "
                    f"{p_value:g} at level {test.level:g} with gate {test.gate} is not an accept"
                )
        return control

    @property
    def base_level(self) -> float:
        """The level the next candidate gets from the budget alone (no carried level):
        alpha / horizon while the horizon lasts, then 0."""
        return self.alpha / self.horizon if len(self.tests) < self.horizon else 0.0

    @property
    def next_level(self) -> float:
        """The level the next candidate is tested at (a carried level included)."""
        return self.control().level_for_next()

    @property
    def accepted(self) -> int:
        """How many tested candidates the campaign accepted."""
        return sum(test.decision == "accept" for test in self.tests)


RECHECKED = (
    "re-measured the parent beside the candidate (its val replays were from an earlier window)"
)
"""What a decision reason starts with when online control measured the pair again."""


def earlier_window(units: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a measurement (its units blob) compared replays of different windows: a unit
    reused from an earlier measurement (the parent's baselines), or a case some of whose
    scored units were restored from an earlier session's journal and some replayed in this
    one. Online control re-measures such a candidate before accepting it (`MeasureRequest.
    fresh`): a world that drifted in between (an endpoint or a model judge that scores
    higher, a flaky service that recovered) lifts one arm alone."""
    restored: dict[Any, set[bool]] = {}
    for unit in units:
        if unit.get("score") is None:
            continue
        if unit.get("reused"):
            return True
        restored.setdefault(unit.get("case"), set()).add(bool(unit.get("restored")))
    return any(len(flags) > 1 for flags in restored.values())


def p_beside_level(p: float, level: float) -> tuple[str, str]:
    """``p`` and ``level`` printed with as many significant digits (2 to 6) as it takes for
    the printed numbers to differ when the numbers do, so "p = X > level Y" never reads as
    a tie or the wrong way (found by review: p 0.0504 against 0.05 printed "p = 0.05 >
    0.05")."""
    for digits in range(2, 7):
        shown_p, shown_level = f"{p:.{digits}g}", f"{level:.{digits}g}"
        if p == level or shown_p != shown_level:
            break
    return shown_p, shown_level


def campaign_alpha(config: CampaignConfig) -> float:
    """The campaign's error budget alpha = 1 - confidence (exact decimal), or its
    ``error_budget`` when set (an evolve service job's share): what online control spends
    over candidates and confirmations over cycles."""
    if config.error_budget is not None:
        return config.error_budget
    from evolane.stats import as_fraction

    return float(1 - as_fraction(config.gate.confidence))


def opening_budget(config: CampaignConfig, cycles_left: int) -> OnlineBudget:
    """A fresh budget: `campaign_alpha` over iterations x population x ``cycles_left``
    candidates."""
    horizon = config.iterations * config.population * max(1, cycles_left)
    return OnlineBudget(alpha=campaign_alpha(config), horizon=horizon)


class OnlineRule:
    """The campaign's acceptance rule under an online budget (IO-free): `judge` turns a
    candidate's gate result into the campaign's decision and records the test."""

    def __init__(self, budget: OnlineBudget) -> None:
        """Continue ``budget`` (its tests are recorded again: the levels continue)."""
        self._alpha, self._horizon = budget.alpha, budget.horizon
        self._control = budget.control()
        self._tests = list(budget.tests)

    def judge(
        self,
        slot: str,
        gate: GateResult,
        deltas: np.ndarray,
        config: GateConfig,
        pass_fail: bool = False,
    ) -> GateResult:
        """Test one candidate (``deltas``: per-case candidate - parent on val, the full
        evaluation when the gate accepted); returns ``gate`` with the campaign's decision
        and, when the gate accepted, a reason naming the online rule with its numbers. A
        candidate the gate did not accept is recorded too (it spends its share of the
        budget and ends a carried level), without a p-value. ``pass_fail``: every score is
        0 or 1 by construction (`CampaignConfig.pass_fail`)."""
        return self.decide(slot, gate, self.p_value(gate, deltas, config, pass_fail))

    @staticmethod
    def p_value(
        gate: GateResult, deltas: np.ndarray, config: GateConfig, pass_fail: bool = False
    ) -> float | None:
        """The p-value of no true gain of ``deltas`` (`stats.online_p_value`; 1 without a
        comparable case) when the gate accepts, else None (the gate decides)."""
        from evolane.stats import online_p_value

        if gate.decision != "accept":
            return None
        return online_p_value(deltas, config, pass_fail) if deltas.size else 1.0

    def would_accept(self, gate: GateResult, p_value: float | None) -> bool:
        """Whether `decide` would accept (nothing recorded): the gate accepts and
        ``p_value`` is at most the next candidate's level."""
        if gate.decision != "accept" or p_value is None:
            return False
        return p_value <= self._control.level_for_next()

    def decide(self, slot: str, gate: GateResult, p_value: float | None) -> GateResult:
        """The rule itself, given the candidate's p-value (None: the gate did not accept):
        accepted iff the gate accepts and p <= the next level; the test is recorded."""
        if gate.decision == "accept" and p_value is None:
            raise ValueError("a candidate the gate accepts needs its p-value")
        tested, p = p_value is not None, 1.0 if p_value is None else p_value
        index = self._control.tested + 1
        verdict = self._control.record(gate.decision, p_value=p)
        self._tests.append(
            OnlineTest(
                slot=slot,
                index=index,
                gate=gate.decision,
                p_value=p if tested else None,
                level=verdict.level,
                decision=verdict.decision,
            )
        )
        if gate.decision != "accept":  # the gate's own rule decided: its reason stands
            return gate
        relation = "<=" if verdict.decision == "accept" else ">"
        spent = ", past the horizon" if index > self._horizon else ""
        outcome = "accepted" if verdict.decision == "accept" else "rejected"
        shown_p, shown_level = p_beside_level(p, verdict.level)
        reason = (
            f"gate accepts; online control: p = {shown_p} {relation} level {shown_level} "
            f"(candidate {index} of {self._horizon}{spent}, alpha {self._alpha:g}): "
            f"{outcome}; gate: {gate.reason}"
        )
        return gate.model_copy(update={"decision": verdict.decision, "reason": reason[:256]})

    @property
    def budget(self) -> OnlineBudget:
        """The budget with every test recorded so far."""
        return OnlineBudget(alpha=self._alpha, horizon=self._horizon, tests=tuple(self._tests))


def online_words(
    budget: OnlineBudget,
    val_cases: int | None = None,
    val_fed: bool = False,
    *,
    margin: float = 0.0,
    pass_fail: bool = True,
    order_seed: int = 0,
) -> str:
    """Online error control in words, with its guarantee and its price, for the report;
    ``val_fed``: the optimizer saw val outcomes, so the guarantee does not hold (said so);
    ``margin``, ``pass_fail`` and ``order_seed`` (the gate's seed, as the preflight and the
    decision read it) name the test of no true gain (`stats.no_gain_p_value`)."""
    alpha, horizon = budget.alpha, budget.horizon
    text = (
        f"online: an error budget alpha = {alpha:g} (1 - confidence) is spent over the "
        f"campaign's {horizon} candidates (online fallback procedure: each tested at level "
        f"{alpha / horizon:.2g}, plus the level of an accepted predecessor); a candidate is "
        "accepted only when the gate accepts and the paired p-value of no true gain of its "
        "full val evaluation against its parent reaches its level"
    )
    if val_fed:
        text += (
            "; NO GUARANTEE here: the optimizer saw the val outcomes (no train split), so an "
            "edit fitted to those cases can pass; add train cases for the bound to hold"
        )
    else:
        text += (
            f", so the probability that the campaign publishes any edit with no true gain is "
            f"at most {alpha:g}, however many candidates it tries (the optimizer never saw "
            "the val outcomes)"
        )
    if val_cases is not None:
        from evolane.stats import online_cases_needed

        level = alpha / horizon
        needed = online_cases_needed(
            level, val_cases, margin=margin, pass_fail=pass_fail, order_seed=order_seed
        )
        gain = "fix" if pass_fail else "gain the full score on"
        price = (
            f"a candidate must {gain} at least {needed} of them with none worse"
            if needed is not None
            else "no candidate can reach its level"
        )
        text += (
            f"; the price is power: with {val_cases} val cases {price}, so add test cases to "
            "confirm the best instead"
        )
    tested = len(budget.tests)
    text += f"; {tested} of {horizon} candidates tested so far, {budget.accepted} accepted"
    if tested >= horizon:
        text += " (the budget is spent: only a candidate right after an accepted one can pass)"
    return text
