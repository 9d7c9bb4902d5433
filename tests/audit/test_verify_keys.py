"""audit_verify tells erasures from lost keys (issue 21).

It counted every destroyed key as an erasure. Now only a key whose ``erased_at`` (set by an
erasure or retention) records it counts as one; a key destroyed without that record, missing,
or no longer opened by ``PRIVACY_KEYS`` is a lost key: named, exit code 3, not tampering.
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from audit.models import Event, EventType
from audit.services import event_record
from audit.triggers import triggers_create, triggers_drop
from audit.verify import audit_verify
from leads import privacy
from leads.models import Lead, PersonKey
from tests.leads.factories import LeadFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _fresh_cache() -> Any:
    privacy.cache_clear()
    yield
    privacy.cache_clear()


def _sealed_lead(email: str) -> Lead:
    lead = LeadFactory(raw_payload={"email": email})
    lead.person_key_id = privacy.person_key_for(email=email)
    lead.save(update_fields=["person_key"])
    event_record(type=EventType.CRM_CHECKED, lead=lead, data={"summary": f"contact {email}"})
    assert Event.objects.filter(chain=str(lead.pk), sealed__isnull=False).count() == 1
    return lead


def _verify() -> tuple[int, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("audit_verify", stdout=out, stderr=err)
    except CommandError as error:
        return error.returncode, f"{out.getvalue()}{err.getvalue()}{error}"
    return 0, out.getvalue() + err.getvalue()


def test_an_erasure_recorded_on_the_key_is_an_erasure() -> None:
    lead = _sealed_lead("erased@verify.example")
    PersonKey.objects.filter(pk=lead.person_key_id).update(
        wrapped=None, lookup=None, erased_at=timezone.now()
    )
    event_record(type=EventType.ERASED, lead_id=lead.pk, data={"reason": "asked"})
    report = audit_verify()
    assert report.ok
    assert report.sealed_erased == 1
    assert report.key_problems == []
    code, text = _verify()
    assert code == 0, text
    assert "1 sealed event(s) of erased people" in text


def test_a_key_destroyed_without_an_erasure_record_is_a_lost_key_not_an_erasure() -> None:
    lead = _sealed_lead("destroyed@verify.example")
    PersonKey.objects.filter(pk=lead.person_key_id).update(wrapped=None)
    report = audit_verify()
    assert report.ok  # the chain holds: not tampering
    assert report.sealed_erased == 0
    assert [(p.kind, p.person_key_id, p.events) for p in report.key_problems] == [
        ("destroyed", lead.person_key_id, 1)
    ]
    code, text = _verify()
    assert code == 3, text
    assert "lost key: person key" in text
    assert "destroyed without an erasure record" in text
    assert "tampered" not in text
    assert "erased people" not in text


def test_a_missing_key_row_is_a_lost_key() -> None:
    lead = _sealed_lead("missing@verify.example")
    Lead.objects.filter(pk=lead.pk).update(person_key=None)
    PersonKey.objects.filter(pk=lead.person_key_id).delete()
    report = audit_verify()
    assert [(p.kind, p.events) for p in report.key_problems] == [("missing", 1)]
    assert _verify()[0] == 3


def test_a_master_key_removed_is_a_lost_key() -> None:
    old, new = privacy.new_master_key(), privacy.new_master_key()
    with override_settings(PRIVACY_KEYS=[old]):
        lead = _sealed_lead("lost@verify.example")
    privacy.cache_clear()
    with override_settings(PRIVACY_KEYS=[new]):
        report = audit_verify()
        assert report.ok
        assert [(p.kind, p.person_key_id) for p in report.key_problems] == [
            ("lost", lead.person_key_id)
        ]
        code, text = _verify()
        assert code == 3
        assert "no key in PRIVACY_KEYS unwraps it" in text
    with override_settings(PRIVACY_KEYS=[new, old]):  # put back: nothing lost
        assert audit_verify().key_problems == []
        assert _verify()[0] == 0


def test_a_replaced_wrapped_key_that_opens_nothing_is_a_lost_key() -> None:
    lead = _sealed_lead("swapped@verify.example")
    other = privacy.person_key_for(email="someone@verify.example")
    wrapped = PersonKey.objects.get(pk=other).wrapped
    PersonKey.objects.filter(pk=lead.person_key_id).update(wrapped=wrapped)
    report = audit_verify()
    assert [(p.kind, p.person_key_id) for p in report.key_problems] == [
        ("unopenable", lead.person_key_id)
    ]


def test_tampering_still_wins_over_a_lost_key() -> None:
    lead = _sealed_lead("both@verify.example")
    PersonKey.objects.filter(pk=lead.person_key_id).update(wrapped=None)
    triggers_drop(connection)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE audit_event SET actor = 'someone else' WHERE chain = %s", [str(lead.pk)]
            )
    finally:
        triggers_create(connection)
    code, text = _verify()
    assert code == 1
    assert "audit log tampered" in text
    assert "lost key: person key" in text


@pytest.mark.parametrize("recorded", [None, EventType.PRUNED])
def test_a_key_marked_erased_counts_only_with_an_erasure_in_the_chain(recorded: Any) -> None:
    """Anyone who can write the key table could destroy a person's sealed history and set
    ``erased_at``: audit_verify took that for an erasure. An erasure (or retention's pruning)
    appends its event to the lead's hash chain; without one it is a lost key (final review)."""
    lead = _sealed_lead("forged@verify.example")
    PersonKey.objects.filter(pk=lead.person_key_id).update(
        wrapped=None, lookup=None, erased_at=timezone.now()
    )
    if recorded is not None:
        event_record(type=recorded, lead_id=lead.pk, data={"reason": "retention"})
        report = audit_verify()
        assert (report.sealed_erased, report.key_problems) == (1, [])
        assert _verify()[0] == 0
        return
    report = audit_verify()
    assert report.ok  # the chain holds: not tampering of a row
    assert report.sealed_erased == 0
    assert [(p.kind, p.person_key_id, p.events) for p in report.key_problems] == [
        ("unrecorded", lead.person_key_id, 1)
    ]
    code, text = _verify()
    assert code == 3, text
    assert "marked erased, but no erasure or pruning is in its lead's audit chain" in text
