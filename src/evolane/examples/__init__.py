"""Built-in workloads: plain command-line programs that stand in for a user's agent, judge
and optimizer. They import only the standard library, so each call starts in milliseconds."""
