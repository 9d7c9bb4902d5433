from django.urls import path, re_path

from leads import api, status_api

# The intake URLs answer with or without the trailing slash: a redirect would turn a
# marketing tool's POST into a GET and lose the lead.
urlpatterns = [
    re_path(r"^intake/(?P<slug>[^/]+)/?$", api.IntakeView.as_view(), name="intake"),
    re_path(
        r"^intake/(?P<slug>[^/]+)/batch/?$", api.IntakeBatchView.as_view(), name="intake-batch"
    ),
    path("status/<str:lead_id>/<str:token>/", status_api.lead_status, name="lead-status"),
    path("leads/", api.LeadListView.as_view(), name="lead-list"),
    path("leads/<str:lead_id>/", api.LeadDetailView.as_view(), name="lead-detail"),
]
