import pytest
from django.db import OperationalError
from django.http import HttpResponse
from django.test import RequestFactory

from config.errors import DatabaseUnavailableMiddleware


@pytest.mark.django_db
def test_unknown_api_url_is_a_json_404(client):
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": {"code": "not_found", "message": "No such endpoint."}}


@pytest.mark.django_db
def test_unknown_page_url_is_not_json(client):
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert "application/json" not in response["Content-Type"]


def test_database_outage_becomes_503_json_with_retry_after(settings):
    settings.DB_UNAVAILABLE_RETRY_AFTER_SECONDS = 17
    middleware = DatabaseUnavailableMiddleware(lambda request: HttpResponse())
    request = RequestFactory().post("/api/v1/intake/webinar/")
    response = middleware.process_exception(
        request, OperationalError("server closed the connection")
    )
    assert response is not None
    assert response.status_code == 503
    assert response["Retry-After"] == "17"
    assert b'"code": "service_unavailable"' in response.content


def test_other_exceptions_are_left_alone():
    middleware = DatabaseUnavailableMiddleware(lambda request: HttpResponse())
    request = RequestFactory().get("/api/v1/leads/")
    assert middleware.process_exception(request, ValueError("boom")) is None
