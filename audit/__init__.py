"""The append-only event log, and the history and dashboard pages."""
