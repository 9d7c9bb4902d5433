"""A scoped API token does no more than its owning user may: each scope needs the owner's Django
permission for the operation as well (docs/api.md, "Configuration API: tokens and scopes").

Per scope: an owner lacking the permission gets 403 and nothing is written; an owner who
loses the permission after the token was made loses it for the token too; a deactivated owner's
token is refused (401, as documented) and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User

from audit.models import Event, EventType
from routing.config_api.tokens import api_token_create
from routing.decisions import clear_live_config_cache
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.drafts.services import config_draft_create
from routing.models import AdminJob, Rep, ValueList
from routing.rules_io import rules_import
from routing.timeoff.models import RepAbsence
from tests.routing.factories import SCOPE_PERMS, user_with_perms
from tests.routing.test_pipeline import RULES

pytestmark = pytest.mark.django_db

BASE = "/api/v1/config/"
ROSTER = f"{BASE}roster/reps/"
PATCH = {"value_lists": {"competitors": {"values": ["x.io"]}}}


@pytest.fixture
def published() -> Any:
    clear_live_config_cache()
    rules_import(RULES, publish=True)
    _open_draft()  # and version 1, the baseline, to roll back to
    yield
    clear_live_config_cache()


def _call(client: Any, method: str, url: str, secret: str, body: Any = None) -> Any:
    return getattr(client, method)(
        url,
        body if body is not None else {},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {secret}",
    )


def _state() -> tuple[Any, ...]:
    """Everything a refused call must leave as it was."""
    return (
        sorted(Rep.objects.values_list("email", "name", "active", "max_open")),
        RepAbsence.objects.count(),
        sorted(ConfigDraft.objects.values_list("id", "status", "updated_at")),
        ConfigSnapshot.objects.count(),
        AdminJob.objects.count(),  # nothing queued either
        sorted(ValueList.objects.values_list("name", "values")),
        Event.objects.filter(type=EventType.CONFIG_CHANGED).exclude(actor="test").count(),
    )


def _open_draft() -> int:
    """The open draft, begun (by "test", before any call is judged) when there is none."""
    draft = ConfigDraft.objects.filter(status="open").order_by("id").first()
    return int((draft or config_draft_create(actor="test")).pk)


# (scope, the permission it needs here, the call: (client, secret) -> response, its success)
Call = Callable[[Any, str], Any]
CASES: list[tuple[str, str, Call, int]] = [
    ("read", "routing.view_rep", lambda c, s: _call(c, "get", ROSTER, s), 200),
    ("read", "routing.view_configdraft", lambda c, s: _call(c, "get", BASE, s), 200),
    (
        "roster",
        "routing.change_rep",
        lambda c, s: _call(c, "post", ROSTER, s, {"email": "new@example.com", "name": "New"}),
        201,
    ),
    (
        "roster",
        "routing.change_rep",
        lambda c, s: _call(
            c,
            "post",
            f"{ROSTER}ana@example.com/absences/",
            s,
            {"from": "2031-01-01T00:00:00+00:00", "to": "2031-01-02T00:00:00+00:00"},
        ),
        201,
    ),
    (
        "roster",
        "routing.change_rep",
        lambda c, s: _call(c, "delete", f"{ROSTER}ana@example.com/", s),
        200,
    ),
    (
        "draft",
        "routing.change_configdraft",
        lambda c, s: _call(c, "post", f"{BASE}drafts/", s),
        201,
    ),
    (
        "draft",
        "routing.change_configdraft",
        lambda c, s: _call(c, "patch", f"{BASE}drafts/{_open_draft()}/", s, PATCH),
        200,
    ),
    (
        "publish",
        "routing.add_configsnapshot",
        lambda c, s: _call(c, "post", f"{BASE}drafts/{_open_draft()}/publish/", s),
        202,
    ),
    (
        "publish",
        "routing.add_configsnapshot",
        lambda c, s: _call(c, "post", f"{BASE}versions/1/rollback/", s),
        202,
    ),
]
IDS = [f"{scope}-{i}" for i, (scope, *_rest) in enumerate(CASES)]


@pytest.mark.parametrize(("scope", "perm", "call", "ok"), CASES, ids=IDS)
def test_a_scope_whose_owner_lacks_the_permission_is_403_and_writes_nothing(
    client: Any, published: Any, scope: str, perm: str, call: Call, ok: int
) -> None:
    # The owner holds every permission but the one this operation needs.
    others = [p for perms in SCOPE_PERMS.values() for p in perms if p != perm]
    owner = user_with_perms("owner", *others)
    secret = api_token_create(user=owner, name="t", scopes=scope, actor="test").secret
    before = _state()
    response = call(client, secret)
    assert response.status_code == 403, response.content
    error = response.json()["error"]
    assert error["code"] == "forbidden"
    assert perm in error["message"], error["message"]
    assert '("owner")' in error["message"], error["message"]
    assert _state() == before

    # Granted, the same token does it: the refusal was the owner's permission, nothing else.
    app_label, codename = perm.split(".")
    owner.user_permissions.add(
        Permission.objects.get(content_type__app_label=app_label, codename=codename)
    )
    response = call(client, secret)
    assert response.status_code == ok, response.content


@pytest.mark.parametrize("scope", list(SCOPE_PERMS))
def test_an_owner_who_loses_the_permission_or_is_deactivated_takes_the_token_with_them(
    client: Any, published: Any, scope: str
) -> None:
    owner = user_with_perms("owner", scope)
    secret = api_token_create(user=owner, name="t", scopes=scope, actor="test").secret
    call, ok = next((c, o) for s, _p, c, o in CASES if s == scope)
    assert call(client, secret).status_code == ok  # works while the owner may

    owner.user_permissions.clear()
    _open_draft()
    before = _state()
    refused = call(client, secret)
    assert refused.status_code == 403, refused.content
    assert _state() == before

    user_with_perms("owner", scope)
    User.objects.filter(pk=owner.pk).update(is_active=False)
    refused = call(client, secret)
    assert refused.status_code == 401, refused.content  # docs/api.md: its user is inactive
    assert "inactive" in refused.json()["error"]["message"]
    assert _state() == before


def test_a_superuser_owner_needs_no_explicit_permission(client: Any, published: Any) -> None:
    boss = User.objects.create_superuser(username="boss", email="boss@example.com")
    secret = api_token_create(user=boss, name="t", scopes="read", actor="test").secret
    assert _call(client, "get", BASE, secret).status_code == 200


def _operations(client: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Every configuration and roster operation of the published OpenAPI document."""
    schema = client.get("/api/v1/schema/?format=json").json()
    return [
        (method, path, operation)
        for path, item in schema["paths"].items()
        if path.startswith("/api/v1/config/")
        for method, operation in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def test_every_operation_refuses_without_credentials_scope_or_owner_permission_in_json(
    client: Any, published: Any
) -> None:
    """Per operation of the schema: no credentials 401, a token lacking the scope 403, a token
    whose owner lacks the permission 403; each documented, each in the API's JSON error shape,
    and nothing written by any of them."""
    values = {"ref": "ana@example.com", "draft_id": str(_open_draft()), "number": "1"}
    values["absence_id"] = "1"
    values["job_id"] = str(
        AdminJob.objects.create(kind="config_publish", params={"draft_id": 1}).pk
    )
    no_scope = api_token_create(
        user=user_with_perms("all-perms", *SCOPE_PERMS), name="none", scopes="read", actor="test"
    ).secret
    powerless = api_token_create(
        user=user_with_perms("no-perms"),
        name="powerless",
        scopes=list(SCOPE_PERMS),
        actor="test",
    ).secret
    operations = _operations(client)
    assert len(operations) == 26  # 17 of the configuration (a job's), 9 of the roster
    before = _state()
    for method, path, operation in operations:
        url = path
        for name, value in values.items():
            url = url.replace("{" + name + "}", value)
        documented = set(operation["responses"])
        assert {"401", "403"} <= documented, (method, path, sorted(documented))
        attempts = [("anonymous", None, 401), ("powerless", powerless, 403)]
        if method != "get":  # a read-only token: every write is outside its scope
            attempts.append(("no scope", no_scope, 403))
        for label, secret, status in attempts:
            headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}
            response = getattr(client, method)(url, {}, content_type="application/json", **headers)
            assert response.status_code == status, (label, method, url, response.content)
            error = response.json()["error"]
            assert isinstance(error["code"], str), (label, method, url, error)
            assert isinstance(error["message"], str), (label, method, url, error)
    assert _state() == before
