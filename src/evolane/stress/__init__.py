"""The stress harness: scenarios that load the runtime with seeded faults and check invariants.

`run_scenario(name, seed=, duration=, quick=, options=)` runs one of `SCENARIOS` (``actors``,
``ask``, ``cascade``, ``processes``, ``budget``, ``slow-observer``, ``crash-resume``) and
returns a `ScenarioReport`; the same seed reproduces the same fault schedule.
"""

from evolane.stress._actor_storm import StressConfig, StressReport, fault_schedule, run_actor_stress
from evolane.stress._ask_storm import AskConfig, ask_plan, run_ask_storm
from evolane.stress._budget_storm import BudgetConfig, budget_plan, run_budget_storm
from evolane.stress._cascade import CascadeConfig, run_cascade
from evolane.stress._crash_resume import ResumeConfig, run_crash_resume
from evolane.stress._harness import RoundResult, Scenario, ScenarioReport
from evolane.stress._options import SettingError, explain, parse_settings, report_rows
from evolane.stress._process_storm import ProcessConfig, process_plan, run_process_storm
from evolane.stress._scenarios import SCENARIOS, run_scenario, scenario_config
from evolane.stress._slow_observer import ObserverConfig, run_slow_observer

__all__ = [
    "SCENARIOS",
    "AskConfig",
    "BudgetConfig",
    "CascadeConfig",
    "ObserverConfig",
    "ProcessConfig",
    "ResumeConfig",
    "RoundResult",
    "Scenario",
    "ScenarioReport",
    "SettingError",
    "StressConfig",
    "StressReport",
    "ask_plan",
    "budget_plan",
    "explain",
    "fault_schedule",
    "parse_settings",
    "process_plan",
    "report_rows",
    "run_actor_stress",
    "run_ask_storm",
    "run_budget_storm",
    "run_cascade",
    "run_crash_resume",
    "run_process_storm",
    "run_scenario",
    "run_slow_observer",
    "scenario_config",
]
