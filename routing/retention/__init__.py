"""Retention: personal data kept no longer than its policy (docs/operations.md "Retention")."""
