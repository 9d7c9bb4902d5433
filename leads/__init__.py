"""Sources, the canonical lead, the intake API and normalisation."""
