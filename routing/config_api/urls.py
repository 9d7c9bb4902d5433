"""Configuration API URLs, included under ``/api/v1/config/``."""

from django.urls import path

from routing.config_api import api

urlpatterns = [
    path("roster/reps/", api.RosterRepListView.as_view(), name="roster-reps"),
    path("roster/reps/<str:ref>/", api.RosterRepDetailView.as_view(), name="roster-rep"),
    path(
        "roster/reps/<str:ref>/absences/",
        api.RosterAbsenceListView.as_view(),
        name="roster-absences",
    ),
    path(
        "roster/reps/<str:ref>/absences/<int:absence_id>/",
        api.RosterAbsenceDetailView.as_view(),
        name="roster-absence",
    ),
]
