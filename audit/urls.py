"""Pages: login (password or single sign-on), logout, password change, history, dashboard."""

from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy

from audit import rep_views, sso, views

urlpatterns = [
    path("", views.home, name="home"),
    path("accounts/login/", sso.LoginPage.as_view(), name="login"),
    # Single sign-on (404 while not configured); the callback is the redirect URI to register.
    path("accounts/sso/start/", sso.SsoStartView.as_view(), name="oidc_authentication_init"),
    path(
        "accounts/sso/callback/",
        sso.SsoCallbackView.as_view(),
        name="oidc_authentication_callback",
    ),
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
    path(
        "accounts/set-password/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(
            success_url=reverse_lazy("set-password-done"), post_reset_login=False
        ),
        name="set-password",
    ),
    path(
        "accounts/set-password/done/",
        auth_views.PasswordResetCompleteView.as_view(),
        name="set-password-done",
    ),
    path("me/", rep_views.me, name="me"),
    path("me/leads/<str:lead_id>/touch/", rep_views.me_touch, name="me-touch"),
    path("me/time-off/", rep_views.me_absence_add, name="me-absence-add"),
    path(
        "me/time-off/<int:absence_id>/cancel/",
        rep_views.me_absence_cancel,
        name="me-absence-cancel",
    ),
    path("touch/<str:token>/", rep_views.touch_link, name="touch-link"),
    path("accounts/time-zone/", views.time_zone_settings, name="time-zone"),
    path("history/", views.history, name="history"),
    path("history/export.csv", views.history_export, name="history-export"),
    path("history/<str:lead_id>/", views.lead_page, name="history-lead"),
    path("history/<str:lead_id>/reassign/", views.lead_reassign_action, name="history-reassign"),
    path("history/<str:lead_id>/touch/", views.lead_touch_action, name="history-touch"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("dashboard/<str:table>.csv", views.dashboard_export, name="dashboard-export"),
]
