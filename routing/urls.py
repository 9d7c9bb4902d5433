"""Routing API URLs, included under ``/api/v1/``."""

from django.urls import re_path

from routing import api

urlpatterns = [
    re_path(r"^routing/simulate/?$", api.SimulateView.as_view(), name="routing-simulate"),
]
