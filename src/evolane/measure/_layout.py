"""Where a measurement's units are: how many repetitions, the order cases are read in, where
each unit sits in plan order (`UnitLayout`: by arithmetic, no map or object per unit) and the
order they start in. No IO."""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from evolane.messages import MeasureRequest
from evolane.stats import cluster_order, together

if TYPE_CHECKING:
    from evolane.measure._scheduling import SchedulerSettings
    from evolane.stats import Clusters


def repetitions(request: MeasureRequest, cases: int, min_cases: int) -> tuple[int, int]:
    """Explicit repetitions win; else 1/1 with enough independent cases, 2/3 without."""
    adaptive = (1, 1) if cases >= min_cases else (2, 3)
    return (
        request.baseline_repetitions or adaptive[0],
        request.candidate_repetitions or adaptive[1],
    )


def reading_order(
    request: MeasureRequest, settings: SchedulerSettings
) -> tuple[list[str], dict[str, int]]:
    """The cases a measurement reads, in the order it reads them, and each case's place in
    the dataset. A split is read in the run's seeded order (`stats.case_order`, a function
    of the case ids and ``settings.seed`` alone), so no file order (a dataset sorted by
    difficulty or topic) can steer an early stop; cases the request names keep its order.
    Clustered cases (``settings.clusters``) are read cluster by cluster (`stats.cluster_order`;
    the cases a request names, each cluster's at its first: `stats.together`), so early stop
    can read whole clusters; without two cases of one cluster the order is as above. The
    request's ``skip_case_ids`` and their clusters' cases are not read (numbers stay)."""
    if request.case_ids:
        named = list(request.case_ids)
        numbers = {case_id: index for index, case_id in enumerate(named)}
        return together(named, settings.clusters), numbers
    in_file = list(settings.splits.get(request.split, ()))
    numbers = {case_id: index for index, case_id in enumerate(in_file)}
    if request.skip_case_ids:
        in_file = skipping(in_file, request.skip_case_ids, settings.clusters)
    return cluster_order(in_file, settings.seed, settings.clusters), numbers


def skipping(cases: list[str], skip: tuple[str, ...], clusters: Clusters | None) -> list[str]:
    """``cases`` but those in ``skip`` and every case of a cluster one of them is in."""
    named = clusters or {}
    left_out = {named[case] for case in skip if case in named}
    return [c for c in cases if c not in skip and named.get(c) not in left_out]


class UnitLayout:
    """Where each unit of a measurement sits, by arithmetic rather than a map or an object per
    unit. Plan order: repetition by repetition, each case (in reading order) with its
    baseline, then its candidate; a candidate's control is its case's baseline of the same
    repetition (the last baseline repetition when the candidate has more). A unit id names
    its case by its number (its place in the dataset), so ids stay the same whatever the
    reading order, and a journal resumes under any order."""

    def __init__(
        self,
        request: MeasureRequest,
        case_ids: list[str],
        reps: tuple[int, int],
        numbers: Mapping[str, int],
    ) -> None:
        self.measurement_id = request.measurement_id
        self.cases, self.reps = len(case_ids), reps
        self.paired = request.candidate_ref is not None
        self._starts = [0]  # each repetition's first unit
        for rep in range(max(reps)):
            self._starts.append(self._starts[-1] + self.cases * self._arms(rep))
        # a case's number by its place in the reading order, and back (-1: not read)
        self._number_of = array("q", (numbers[case_id] for case_id in case_ids))
        self._place_of = array("q", [-1]) * (max(self._number_of, default=-1) + 1)
        for place, number in enumerate(self._number_of):
            self._place_of[number] = place

    def __len__(self) -> int:
        """The number of units."""
        return self._starts[-1]

    def _arms(self, rep: int) -> int:
        return (rep < self.reps[0]) + (self.paired and rep < self.reps[1])

    def number(self, place: int) -> int:
        """The number (place in the dataset) of the case at ``place`` in the reading order."""
        return self._number_of[place]

    def locate(self, index: int) -> tuple[int, int, bool]:
        """Unit ``index``'s case place (reading order), repetition, and whether it is a
        candidate (IndexError beyond the plan)."""
        if not 0 <= index < self._starts[-1]:
            raise IndexError(index)
        rep = bisect_right(self._starts, index) - 1
        place, arm = divmod(index - self._starts[rep], self._arms(rep))
        return place, rep, bool(arm) or rep >= self.reps[0]

    def index(self, place: int, rep: int, candidate: bool) -> int | None:
        """The index of the unit of the case at ``place`` (reading order), repetition
        ``rep`` and arm; None when the plan has no such unit."""
        if not (0 <= place < self.cases and 0 <= rep < max(self.reps)):
            return None
        baseline = rep < self.reps[0]
        if candidate and not (self.paired and rep < self.reps[1]):
            return None
        if not (candidate or baseline):
            return None
        return self._starts[rep] + place * self._arms(rep) + (candidate and baseline)

    def column(self, rep: int, candidate: bool) -> slice | None:
        """The indices of repetition ``rep``'s units of one arm, case by case in reading
        order, as a slice (None when the plan has no such units)."""
        first = self.index(0, rep, candidate)
        if first is None:
            return None
        step = self._arms(rep)
        return slice(first, first + step * self.cases, step)

    def columns(self) -> list[tuple[int, int]]:
        """Every `column` there is as (start, step), by repetition, the baseline's first: the
        units of the case at place ``k`` are ``start + k * step`` in that order (no list per
        case)."""
        found = (self.column(rep, arm) for rep in range(max(self.reps)) for arm in (False, True))
        return [(column.start, column.step) for column in found if column is not None]

    def places_by_number(self) -> Iterator[int]:
        """The places (reading order) of the cases read, by case number (dataset order)."""
        return (place for place in self._place_of if place >= 0)

    def control(self, index: int) -> int | None:
        """The index of unit ``index``'s control (None for a baseline)."""
        place, rep, candidate = self.locate(index)
        return self.index(place, min(rep, self.reps[0] - 1), False) if candidate else None

    def find(self, unit_id: str) -> int | None:
        """The index `unit_id` names (None for an id of no unit of this plan); the caller
        compares the unit's own id, which also refuses other spellings such as ``007``."""
        parts = unit_id.rsplit(".", 3)
        if len(parts) != 4 or parts[0] != self.measurement_id or parts[3] not in ("b", "c"):
            return None
        number, rep = parts[1], parts[2]
        if not (number.isascii() and number.isdigit() and rep.isascii() and rep.isdigit()):
            return None
        if int(number) >= len(self._place_of):
            return None
        return self.index(self._place_of[int(number)], int(rep), parts[3] == "c")

    def dependents(self, control: int) -> Iterator[int]:
        """The indices of the candidates unit ``control`` is the control of (none unless it
        is a baseline): the same repetition, and every later one for the last baseline."""
        place, control_rep, candidate = self.locate(control)
        if candidate:
            return
        last = self.reps[0] - 1
        for rep in range(self.reps[1] if self.paired else 0):
            if min(rep, last) == control_rep:
                index = self.index(place, rep, True)
                if index is not None:
                    yield index


def start_order(layout: UnitLayout, lanes: int) -> array[int]:
    """Each unit's start priority (lower first), by its index: first repetitions before later
    ones, and within a repetition baselines about a wave of ``lanes`` ahead of the candidates
    that wait for them. Plan order alone lets the last baseline start in the last wave, so
    its candidate runs in a wave of its own after it. One machine integer per unit (the
    repetition above bit 40, the place within it below), not a tuple per unit."""
    order = array("q")
    baselines = candidates = 0
    for index in range(len(layout)):
        _, rep, candidate = layout.locate(index)
        if not candidate:
            place = 2 * baselines  # 2 * lanes before 2 * (baselines - lanes): never negative
            baselines += 1
        else:
            place = 2 * (candidates + lanes) + 1
            candidates += 1
        order.append((rep << 40) + place)
    return order
