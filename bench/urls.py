"""The project's URLs plus ``/bench/bare/``: a bare DRF APIView, the intake's baseline."""

from typing import Any

from django.urls import path
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from config.urls import handler400, handler403, handler404, handler500, urlpatterns

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]


class BareView(APIView):
    """Does nothing but answer: the framework's own cost per request."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]
    throttle_classes: list[Any] = []

    def post(self, request: Request) -> Response:
        return Response(
            {"id": "00000000-0000-0000-0000-000000000000", "status": "received"}, status=202
        )


urlpatterns = [*urlpatterns, path("bench/bare/", BareView.as_view())]
