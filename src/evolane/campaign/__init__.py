"""The campaign: hill-climbing over candidate trees (local gates, optimizer prompts, apply
policies, the run directory, resume, the report)."""
