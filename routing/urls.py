"""Routing API URLs, included under ``/api/v1/``."""

from django.urls import include, path, re_path

from routing import api
from routing.monitoring import api as monitoring_api

urlpatterns = [
    re_path(r"^routing/simulate/?$", api.SimulateView.as_view(), name="routing-simulate"),
    path("leads/<str:lead_id>/touch/", api.LeadTouchView.as_view(), name="lead-touch"),
    path("leads/<str:lead_id>/reassign/", api.LeadReassignView.as_view(), name="lead-reassign"),
    path("leads/<str:lead_id>/reroute/", api.LeadRerouteView.as_view(), name="lead-reroute"),
    path("leads/<str:lead_id>/erase/", api.LeadEraseView.as_view(), name="lead-erase"),
    path("alerts/", monitoring_api.AlertListView.as_view(), name="alert-list"),
    path("config/", include("routing.config_api.urls")),
]
