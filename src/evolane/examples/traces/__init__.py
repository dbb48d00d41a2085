"""Improve an agent from its own traces: the self-evolution agent as a live agent that writes
trajectory records (its failures among them), and the commands a campaign from those records
runs (``python -m evolane.examples.traces``; see the README section "Improve your agent from
its own traces")."""

from evolane.examples.traces._agent import run_tasks, task_record
from evolane.examples.traces._workspace import campaign_settings, write_traces_workspace

__all__ = ["campaign_settings", "run_tasks", "task_record", "write_traces_workspace"]
