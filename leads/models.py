"""Models for leads (built by the intake issue)."""
