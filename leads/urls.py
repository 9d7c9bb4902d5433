from django.urls import path

from leads import api

urlpatterns = [
    path("intake/<str:slug>/", api.IntakeView.as_view(), name="intake"),
    path("intake/<str:slug>/batch/", api.IntakeBatchView.as_view(), name="intake-batch"),
    path("leads/", api.LeadListView.as_view(), name="lead-list"),
    path("leads/<str:lead_id>/", api.LeadDetailView.as_view(), name="lead-detail"),
]
