"""Reps, teams, territories, accounts, rulesets, the decision engine and the Celery pipeline."""
