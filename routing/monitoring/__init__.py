"""Watching the pipeline so nobody has to: alerts, SLA timers, backlog checks and metrics."""
