"""Fetch stages: a lead its notification only names is fetched from the vendor's API before the
pipeline reads it (Meta Lead Ads' leadgen webhook: ``routing.fetch.meta``)."""
