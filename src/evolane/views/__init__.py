"""What a person sees of a run: one pure reducer from progress events to a view state, the
reader of ``events.jsonl``, and the self-contained ``report.html`` drawn from the report
and that same state (DESIGN §12), so the live view, ``watch`` and the page cannot disagree.
"""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.views._cases import (
        INFRA_OWNERS,
        CaseRuns,
        Category,
        arm_scores,
        case_runs,
        left_out_at_zero,
        mean_passes,
        run_kind,
    )
    from evolane.views._events import (
        MAX_EVENTS_BYTES,
        EventDecoder,
        EventTail,
        read_events,
    )
    from evolane.views._history import (
        MAX_POINTS,
        DecisionPoint,
        History,
        LanePoint,
        Series,
        SpendPoint,
    )
    from evolane.views._page import render_html
    from evolane.views._scrub import scrub
    from evolane.views._state import TERMINAL_STAGES, ViewState, kind_of
    from evolane.views._words import isolation_text, isolation_words, token_count
    from evolane.views._write import ReportPageError, page_data, write_report_html

__all__ = [
    "INFRA_OWNERS",
    "MAX_EVENTS_BYTES",
    "MAX_POINTS",
    "TERMINAL_STAGES",
    "CaseRuns",
    "Category",
    "DecisionPoint",
    "EventDecoder",
    "EventTail",
    "History",
    "LanePoint",
    "ReportPageError",
    "Series",
    "SpendPoint",
    "ViewState",
    "arm_scores",
    "case_runs",
    "isolation_text",
    "isolation_words",
    "kind_of",
    "left_out_at_zero",
    "mean_passes",
    "page_data",
    "read_events",
    "render_html",
    "run_kind",
    "scrub",
    "token_count",
    "write_report_html",
]

__getattr__ = lazy_exports(__name__)
