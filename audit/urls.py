"""Pages: login/logout/password change, history, a lead and its actions, the dashboard."""

from django.contrib.auth import views as auth_views
from django.urls import path

from audit import views

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password/",
        auth_views.PasswordChangeView.as_view(),
        name="password_change",
    ),
    path(
        "accounts/password/done/",
        auth_views.PasswordChangeDoneView.as_view(),
        name="password_change_done",
    ),
    path("accounts/time-zone/", views.time_zone_settings, name="time-zone"),
    path("history/", views.history, name="history"),
    path("history/export.csv", views.history_export, name="history-export"),
    path("history/<str:lead_id>/", views.lead_page, name="history-lead"),
    path("history/<str:lead_id>/reassign/", views.lead_reassign_action, name="history-reassign"),
    path("history/<str:lead_id>/touch/", views.lead_touch_action, name="history-touch"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("dashboard/<str:table>.csv", views.dashboard_export, name="dashboard-export"),
]
