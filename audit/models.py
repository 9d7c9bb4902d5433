"""Models for the audit log (built by the audit issue)."""
