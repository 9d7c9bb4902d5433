"""Top-level URLs: the API under /api/v1/, pages, the admin, and operations endpoints."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from audit import api as audit_api
from audit import sso
from config import health
from leads import status_api
from routing.monitoring import metrics

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
    path("embed/owner.js", status_api.embed_script, name="embed-owner"),
    # With single sign-on on, the admin's login is the login page that offers it.
    path("admin/login/", sso.admin_login, name="admin-login"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("leads.urls")),
    path("api/v1/", include("routing.urls")),
    path("api/v1/people/export/", audit_api.PersonExportView.as_view(), name="person-export"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("audit.urls")),  # pages: login, history, dashboard
]

handler400 = "config.errors.handler400"
handler403 = "config.errors.handler403"
handler404 = "config.errors.handler404"
handler500 = "config.errors.handler500"
