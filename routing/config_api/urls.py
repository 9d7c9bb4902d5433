"""Configuration API URLs, included under ``/api/v1/config/``."""

from django.urls import path

from routing.config_api import api, drafts_api, jobs_api

urlpatterns = [
    path("", drafts_api.PublishedConfigView.as_view(), name="config-published"),
    path("versions/", drafts_api.VersionListView.as_view(), name="config-versions"),
    path("versions/<int:number>/", drafts_api.VersionDetailView.as_view(), name="config-version"),
    path(
        "versions/<int:number>/rollback/",
        drafts_api.VersionRollbackView.as_view(),
        name="config-version-rollback",
    ),
    path("drafts/", drafts_api.DraftListView.as_view(), name="config-drafts"),
    path("drafts/<int:draft_id>/", drafts_api.DraftDetailView.as_view(), name="config-draft"),
    path(
        "drafts/<int:draft_id>/validate/",
        drafts_api.DraftValidateView.as_view(),
        name="config-draft-validate",
    ),
    path(
        "drafts/<int:draft_id>/test/", drafts_api.DraftTestView.as_view(), name="config-draft-test"
    ),
    path(
        "drafts/<int:draft_id>/diff/", drafts_api.DraftDiffView.as_view(), name="config-draft-diff"
    ),
    path(
        "drafts/<int:draft_id>/tables/",
        drafts_api.DraftTableImportView.as_view(),
        name="config-draft-tables",
    ),
    path(
        "drafts/<int:draft_id>/rebase/",
        drafts_api.DraftRebaseView.as_view(),
        name="config-draft-rebase",
    ),
    path(
        "drafts/<int:draft_id>/publish/",
        drafts_api.DraftPublishView.as_view(),
        name="config-draft-publish",
    ),
    path("jobs/<int:job_id>/", jobs_api.ConfigJobView.as_view(), name="config-job"),
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
