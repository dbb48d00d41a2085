"""The stress harness: scenarios that load the runtime with faults and check its invariants."""

from evolane.stress._actor_storm import StressConfig, StressReport, fault_schedule, run_actor_stress

__all__ = ["StressConfig", "StressReport", "fault_schedule", "run_actor_stress"]
