"""The audit log: append-only in the database, hash-chained, verified by audit_verify."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.hashing import HASHED, event_hash, plain_json
from audit.models import ROUTING_CHAIN, Event, EventType
from audit.services import event_record, events_record_received
from audit.triggers import triggers_create, triggers_drop
from tests.leads.factories import LeadFactory

pytestmark = pytest.mark.django_db


def _tamper(sql: str, params: list[object]) -> None:
    """Change the table the way a superuser bypassing the triggers would."""
    with transaction.atomic(), connection.cursor() as cursor:
        triggers_drop(connection)
        cursor.execute(sql, params)
        triggers_create(connection)


def _chain(lead, n=3):
    events_record_received(leads=[lead], actor="source:test")  # the factory's is skipped
    for i in range(n - 1):
        event_record(type=EventType.ASSIGNED, lead=lead, data={"i": i, "score": 0.5})
    return list(Event.objects.filter(chain=str(lead.pk)).order_by("seq"))


def test_events_form_a_chain_per_lead():
    lead = LeadFactory(received_event=False)
    events = _chain(lead)
    assert [e.seq for e in events] == [1, 2, 3]
    assert events[0].prev_hash == ""
    assert events[1].prev_hash == events[0].hash
    assert events[2].prev_hash == events[1].hash
    other = LeadFactory(received_event=False)
    first = event_record(type=EventType.TOUCHED, lead=other)
    assert (first.chain, first.seq, first.prev_hash) == (str(other.pk), 1, "")


def test_events_without_a_lead_go_to_the_routing_chain():
    one = event_record(type=EventType.RULES_PUBLISHED, actor="user:ana", data={"version": 3})
    two = event_record(type=EventType.RULES_PUBLISHED, actor="user:ana", data={"version": 4})
    assert (one.chain, one.seq, two.seq, two.prev_hash) == (ROUTING_CHAIN, 1, 2, one.hash)


def test_unknown_event_types_are_refused():
    with pytest.raises(ValueError, match="unknown audit event type"):
        event_record(type="made_up", lead=LeadFactory(received_event=False))


@pytest.mark.reliability
@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_update_and_delete():
    lead = LeadFactory(received_event=False)
    _chain(lead, 2)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.filter(chain=str(lead.pk)).update(actor="someone else")
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        Event.objects.filter(chain=str(lead.pk)).delete()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        connection.cursor().execute("DELETE FROM audit_event")
    if connection.vendor == "postgresql":
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            connection.cursor().execute("TRUNCATE audit_event CASCADE")
    assert Event.objects.filter(chain=str(lead.pk)).count() == 2
    assert set(Event.objects.values_list("actor", flat=True)) == {"source:test", "system"}


def test_the_hash_survives_the_database_round_trip():
    lead = LeadFactory(received_event=False)
    data = {"big": 1e20, "small": 0.1, "nested": {"b": [1, 2.0, "x"], "a": None}, "uni": "Zoë"}
    event_record(type=EventType.ENRICHED, lead=lead, data=data, trace=[{"rule": "r", "ok": 1.0}])
    stored = Event.objects.get(chain=str(lead.pk))
    assert stored.data["nested"]["b"] == [1, 2, "x"]
    values = Event.objects.filter(pk=stored.pk).values(*HASHED)[0]
    assert event_hash(values) == stored.hash


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False, width=64)
    | st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=8).filter(lambda k: "\x00" not in k), children, max_size=4
        )
    ),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(value=json_values)
def test_plain_json_is_a_fixed_point(value):
    once = plain_json({"v": value})
    assert plain_json(once) == once


def test_audit_verify_passes_an_intact_log():
    lead = LeadFactory(received_event=False)
    _chain(lead)
    out = StringIO()
    call_command("audit_verify", stdout=out)
    assert "audit log intact: 3 events in 1 chains" in out.getvalue()


@pytest.mark.reliability
@pytest.mark.django_db(transaction=True)
def test_audit_verify_names_an_altered_row():
    lead = LeadFactory(received_event=False)
    events = _chain(lead)
    _tamper("UPDATE audit_event SET rep_name = %s WHERE id = %s", ["Mallory", events[1].pk])
    err = StringIO()
    with pytest.raises(CommandError, match="1 finding"):
        call_command("audit_verify", stderr=err, stdout=StringIO())
    assert f"altered: chain {lead.pk} seq 2 (event id {events[1].pk})" in err.getvalue()


@pytest.mark.reliability
@pytest.mark.django_db(transaction=True)
def test_audit_verify_names_a_removed_row_and_a_forged_rehash():
    lead = LeadFactory(received_event=False)
    events = _chain(lead, 4)
    _tamper("DELETE FROM audit_event WHERE id = %s", [events[1].pk])
    # A forger who rewrites a row and recomputes its own hash still breaks the next link.
    forged = {**Event.objects.filter(pk=events[2].pk).values()[0], "actor": "forger"}
    forged_hash = event_hash(forged)
    _tamper(
        "UPDATE audit_event SET actor = %s, hash = %s WHERE id = %s",
        ["forger", forged_hash, events[2].pk],
    )
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("audit_verify", stderr=err, stdout=StringIO())
    report = err.getvalue()
    assert f"missing: chain {lead.pk} seq 2 (no row)" in report
    assert f"relinked: chain {lead.pk} seq 4 (event id {events[3].pk})" in report


def test_the_lead_api_shows_the_timeline_oldest_first(client):
    from django.contrib.auth.models import Permission, User
    from rest_framework.authtoken.models import Token

    user = User.objects.create_user("viewer", password="pw")
    user.user_permissions.add(Permission.objects.get(codename="view_lead"))
    client.defaults["HTTP_AUTHORIZATION"] = f"Token {Token.objects.create(user=user).key}"
    lead = LeadFactory(received_event=False)
    _chain(lead)
    body = client.get(f"/api/v1/leads/{lead.pk}/").json()
    assert [e["type"] for e in body["events"]] == ["received", "assigned", "assigned"]
    assert body["events"][0]["actor"] == "source:test"
    assert body["events"][2]["data"] == {"i": 1, "score": 0.5}


def test_the_admin_shows_events_read_only(admin_client):
    lead = LeadFactory()
    response = admin_client.get("/admin/audit/event/")
    assert response.status_code == 200
    event = Event.objects.get(lead=lead)
    page = admin_client.get(f"/admin/audit/event/{event.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert admin_client.post(f"/admin/audit/event/{event.pk}/delete/").status_code == 403


def test_publishing_rules_is_an_event_with_who_and_which_version(django_user_model):
    from routing.decisions import clear_live_config_cache
    from routing.rules_io import rules_import, ruleset_copy, ruleset_publish
    from tests.routing.test_pipeline import RULES

    ana = django_user_model.objects.create_user("ana", password="pw")
    first = rules_import(RULES, publish=True, actor=ana).ruleset
    ruleset_publish(ruleset=ruleset_copy(ruleset=first), actor=None)
    clear_live_config_cache()
    events = list(Event.objects.filter(chain=ROUTING_CHAIN).order_by("seq"))
    assert [(e.type, e.actor, e.ruleset_version) for e in events] == [
        ("rules_published", "user:ana", first.version),
        ("rules_published", "system", first.version + 1),
    ]
    assert events[1].data["replaced_version"] == first.version
    assert events[0].data["rules"] == 2


@pytest.mark.reliability
@pytest.mark.django_db(transaction=True)
def test_exported_heads_catch_a_deleted_tail_and_a_rewritten_rehashed_chain(tmp_path):
    """Without heads, deleting a chain's last row or rewriting a row and rehashing every row
    after it passed audit_verify. Heads exported before (signed) catch both."""
    from audit.hashing import HASHED

    first, second = LeadFactory(received_event=False), LeadFactory(received_event=False)
    _chain(first, 3)
    _chain(second, 2)
    heads = tmp_path / "heads.json"
    call_command("audit_export_heads", "--output", str(heads), stderr=StringIO())
    call_command("audit_verify", "--heads", str(heads), stdout=StringIO())

    # Delete the tail of one chain, rewrite and rehash the other.
    last = Event.objects.get(chain=str(first.pk), seq=3)
    _tamper("DELETE FROM audit_event WHERE id = %s", [last.pk])
    prev = ""
    for row in Event.objects.filter(chain=str(second.pk)).order_by("seq").values("id", *HASHED):
        values = {**row, "prev_hash": prev}
        if row["seq"] == 1:
            values["actor"] = "forger"
        digest = event_hash(values)
        _tamper(
            "UPDATE audit_event SET actor = %s, prev_hash = %s, hash = %s WHERE id = %s",
            [values["actor"], prev, digest, row["id"]],
        )
        prev = digest
    call_command("audit_verify", stdout=StringIO())  # the chains alone still look intact
    err = StringIO()
    with pytest.raises(CommandError, match="2 finding"):
        call_command("audit_verify", "--heads", str(heads), stderr=err, stdout=StringIO())
    assert f"truncated: chain {first.pk} seq 3" in err.getvalue()
    assert f"rewritten: chain {second.pk} seq 2" in err.getvalue()


def test_an_edited_heads_file_is_refused(tmp_path):
    import json

    _chain(LeadFactory(received_event=False), 2)
    heads = tmp_path / "heads.json"
    call_command("audit_export_heads", "--output", str(heads), stderr=StringIO())
    document = json.loads(heads.read_text())
    chain = next(iter(document["heads"]))
    document["heads"][chain][0] = 1  # pretend the chain was shorter
    heads.write_text(json.dumps(document))
    with pytest.raises(CommandError, match="signature does not match"):
        call_command("audit_verify", "--heads", str(heads), stdout=StringIO())


def test_flush_is_refused_outside_the_test_settings(settings):
    lead = LeadFactory(received_event=False)
    _chain(lead, 2)
    settings.AUDIT_ALLOW_FLUSH = False
    with pytest.raises(CommandError, match="append-only audit log: refused"):
        call_command("flush", "--noinput", stdout=StringIO())
    assert Event.objects.filter(chain=str(lead.pk)).count() == 2


def test_db_grant_app_role_has_nothing_to_do_without_postgresql(monkeypatch):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    out = StringIO()
    call_command("db_grant_app_role", role="leadrouter_app", stdout=out)
    assert "nothing to grant" in out.getvalue()
