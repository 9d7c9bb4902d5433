"""Benchmark settings: production settings plus a bare DRF view to compare the intake with."""

from config.settings.base import *  # noqa: F403

ROOT_URLCONF = "bench.urls"
