"""Single sign-on maps the provider's groups to LeadRouter's roles (issue 22 item 6).

``OIDC_GROUP_ROLES`` names, for each provider group, the roles (Django groups, and ``staff`` for
the admin's staff status) its members have. At every sign-in the person's mapped roles are set
to exactly what their groups give: added, and taken away once they leave the provider's group;
roles no mapping names are left alone. A person the mapping gives a role gets a login at their
first sign-in; anyone else still needs one (as without a mapping).
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group, User
from django.test import Client

from audit.models import Event, EventType
from audit.permissions import SALES_MANAGERS_GROUP, sales_managers_group_sync
from config.settings.base import group_roles_parse
from routing.editor.permissions import REVOPS_GROUP, revops_group_sync
from tests.audit.test_sso import (  # noqa: F401
    _landing,
    _refused,
    _sign_in,
    _signed_in_user,
    provider,
    sso,
)
from tests.routing.factories import RepFactory
from tests.support.oidc_provider import OidcProvider

pytestmark = pytest.mark.django_db

MAPPING = {
    "lr-managers": (SALES_MANAGERS_GROUP,),
    "lr-revops": (REVOPS_GROUP, "staff"),
}


@pytest.fixture
def roles(sso: OidcProvider, settings: Any) -> OidcProvider:  # noqa: F811
    sales_managers_group_sync()
    revops_group_sync()
    settings.OIDC_GROUP_ROLES = MAPPING
    settings.OIDC_GROUPS_CLAIM = "groups"
    return sso


def _groups(user: User) -> set[str]:
    return set(user.groups.values_list("name", flat=True))


def test_the_setting_reads_pairs_of_provider_group_and_roles() -> None:
    assert group_roles_parse({"lr-managers": "Sales managers", "lr-revops": "RevOps; staff"}) == {
        "lr-managers": ("Sales managers",),
        "lr-revops": ("RevOps", "staff"),
    }
    assert group_roles_parse({}) == {}
    with pytest.raises(ValueError, match="no role"):
        group_roles_parse({"lr-managers": " ; "})


def test_a_manager_in_the_mapped_group_gets_a_login_with_the_role_at_first_sign_in(
    client: Client, roles: OidcProvider
) -> None:
    roles.person("Mia@Example.com", groups=["lr-managers", "everyone"])
    page = _landing(client, _sign_in(client))
    assert page.redirect_chain[-1][0] == "/history/"
    mia = User.objects.get(username="mia@example.com")
    assert _signed_in_user(client) == mia.pk
    assert _groups(mia) == {SALES_MANAGERS_GROUP}
    assert not mia.is_staff
    assert not mia.has_usable_password()
    assert client.get("/dashboard/").status_code == 200
    changed = Event.objects.get(type=EventType.CONFIG_CHANGED, data__action="sso_roles")
    assert changed.data["added"] == [SALES_MANAGERS_GROUP]
    assert changed.data["login_created"] is True


def test_roles_follow_the_provider_at_every_sign_in_and_unmapped_ones_stay(
    client: Client, roles: OidcProvider
) -> None:
    own = Group.objects.create(name="Auditors")
    mia = User.objects.create_user("mia", email="mia@example.com")
    mia.groups.add(own, Group.objects.get(name=SALES_MANAGERS_GROUP))
    roles.person("mia@example.com", groups=["lr-revops"])
    _landing(client, _sign_in(client))
    mia.refresh_from_db()
    assert _groups(mia) == {"Auditors", REVOPS_GROUP}
    assert mia.is_staff  # the mapping's "staff"
    # Taken out of every mapped group at the provider: the mapped roles go at the next sign-in.
    client.logout()
    roles.person("mia@example.com")  # no groups claim at all (Okta omits it when none match)
    _sign_in(client)
    mia.refresh_from_db()
    assert _groups(mia) == {"Auditors"}
    assert not mia.is_staff
    assert _signed_in_user(client) == mia.pk  # signed in, with nothing left to open
    assert client.get("/history/").status_code == 403


def test_a_superuser_keeps_staff_status_and_a_rep_keeps_their_page(
    client: Client, roles: OidcProvider
) -> None:
    User.objects.create_superuser("root", email="root@example.com", password="pw-root-123")
    roles.person("root@example.com", groups=[])
    _landing(client, _sign_in(client))
    assert User.objects.get(username="root").is_staff
    client.logout()
    rep = RepFactory(email="ana@example.com")
    roles.person("ana@example.com", groups="lr-managers")  # a single group as a string
    page = _landing(client, _sign_in(client))
    rep.refresh_from_db()
    assert rep.user is not None
    assert _groups(rep.user) == {SALES_MANAGERS_GROUP}
    assert page.status_code == 200


def test_nobody_else_gets_a_login(client: Client, roles: OidcProvider) -> None:
    roles.person("stranger@example.com", groups=["everyone"])
    _refused(_sign_in(client), 403, "has no LeadRouter login")
    assert not User.objects.exists()


@pytest.mark.parametrize(
    "claims",
    [
        {"_claim_names": {"groups": "src1"}, "_claim_sources": {"src1": {"endpoint": "x"}}},
        {"groups": {"lr-managers": True}},
        {"groups": ["lr-managers", 7]},
    ],
)
def test_groups_the_provider_did_not_send_in_full_are_refused_and_change_nothing(
    client: Client, roles: OidcProvider, claims: dict[str, Any]
) -> None:
    mia = User.objects.create_user("mia", email="mia@example.com")
    mia.groups.add(Group.objects.get(name=SALES_MANAGERS_GROUP))
    roles.person("mia@example.com", **claims)
    _refused(_sign_in(client), 403, "groups")
    assert _groups(mia) == {SALES_MANAGERS_GROUP}
    assert _signed_in_user(client) is None


def test_without_a_mapping_roles_are_left_as_the_admin_set_them(
    client: Client,
    sso: OidcProvider,  # noqa: F811
) -> None:
    sales_managers_group_sync()
    mia = User.objects.create_user("mia", email="mia@example.com")
    mia.groups.add(Group.objects.get(name=SALES_MANAGERS_GROUP))
    sso.person("mia@example.com", groups=["lr-revops"])
    _landing(client, _sign_in(client))
    assert _groups(mia) == {SALES_MANAGERS_GROUP}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_first_sign_ins_of_a_manager_at_once_make_one_login(roles: OidcProvider) -> None:
    import threading

    from django.db import connection

    from tests.audit.test_sso import _through_provider, _to_provider

    roles.person("mia@example.com", groups=["lr-managers"])
    clients = [Client(), Client()]
    backs = [_through_provider(_to_provider(c)) for c in clients]
    barrier = threading.Barrier(2)
    answers: list[int] = []

    def finish(c: Client, back: str) -> None:
        try:
            barrier.wait()
            answers.append(c.get(back).status_code)
        finally:
            connection.close()

    threads = [
        threading.Thread(target=finish, args=pair) for pair in zip(clients, backs, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [302, 302]
    mia = User.objects.get()
    assert _groups(mia) == {SALES_MANAGERS_GROUP}
    assert Event.objects.filter(data__action="sso_roles", data__login_created=True).count() == 1
