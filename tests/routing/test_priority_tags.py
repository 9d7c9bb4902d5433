"""A tag rule's priority and tags are stored on the lead, its tag rows and its assignment."""

from __future__ import annotations

from typing import Any, cast

import pytest
from django.apps import apps as django_apps
from hypothesis import given
from hypothesis import strategies as st

from audit.models import EventType
from audit.services import event_record
from leads.models import Lead, LeadStatus, LeadTag
from leads.priority import (
    MAX_TAGS,
    PRIORITY_MAX_LENGTH,
    TAG_MAX_LENGTH,
    priority_clean,
    priority_is_high,
    tags_clean,
)
from leads.services import lead_tags_set
from routing import decisions
from routing.models import Assignment
from routing.priority_backfill import priority_tags_backfill
from routing.services import lead_process, lead_reassign
from tests.leads.factories import LeadFactory, SourceFactory
from tests.routing.factories import make_rep, published_ruleset

HOT_RULES: tuple[dict[str, Any], ...] = (
    {
        "name": "Big companies are hot",
        "when": {"all": [{"field": "employees", "op": "gte", "value": 1000}]},
        "action": {"type": "tag", "priority": "hot", "tags": ["enterprise", "webinar"]},
    },
    {
        "name": "Germany is tagged",
        "when": {"all": [{"field": "country", "op": "eq", "value": "DE"}]},
        "action": {"type": "tag", "priority": "normal", "tags": ["dach", "enterprise"]},
    },
)


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    decisions.clear_live_config_cache()


def _lead(**fields: Any) -> Lead:
    fields.setdefault("email", "someone@corp.example")
    lead = cast(
        Lead,
        LeadFactory(source=SourceFactory(slug="webform"), status=LeadStatus.PROCESSING, **fields),
    )
    return Lead.objects.select_related("source").get(pk=lead.pk)


def _tag_rows(lead: Lead) -> set[str]:
    return set(LeadTag.objects.filter(lead=lead).values_list("tag", flat=True))


@pytest.mark.django_db
def test_a_hot_lead_keeps_its_priority_and_tags_on_the_lead_and_the_assignment() -> None:
    rep = make_rep(email="ana@x.example")
    published_ruleset(*HOT_RULES, {"name": "Ana", "action": {"type": "rep", "rep": rep.email}})
    lead = _lead(employees=5000, country="DE")

    result = decisions.route_lead(lead=lead)

    assert result.status == LeadStatus.ASSIGNED
    stored = Lead.objects.get(pk=lead.pk)
    # The first tag rule's priority wins; tags add up in order, without repeats.
    assert stored.priority == "hot"
    assert stored.tags == ["enterprise", "webinar", "dach"]
    assert _tag_rows(stored) == {"enterprise", "webinar", "dach"}
    assignment = Assignment.objects.get(lead=lead)
    assert (assignment.priority, assignment.tags) == ("hot", ["enterprise", "webinar", "dach"])


@pytest.mark.django_db
def test_an_excluded_or_unassigned_lead_keeps_its_tags_too() -> None:
    published_ruleset(
        *HOT_RULES, {"name": "Nobody", "action": {"type": "exclude", "reason": "test"}}
    )
    lead = _lead(employees=5000)
    assert decisions.route_lead(lead=lead).status == LeadStatus.EXCLUDED
    stored = Lead.objects.get(pk=lead.pk)
    assert (stored.priority, stored.tags) == ("hot", ["enterprise", "webinar"])
    assert _tag_rows(stored) == {"enterprise", "webinar"}


@pytest.mark.django_db
def test_a_reassignment_carries_the_leads_priority_and_tags() -> None:
    ana = make_rep(email="ana@x.example")
    ben = make_rep(email="ben@x.example")
    published_ruleset(*HOT_RULES, {"name": "Ana", "action": {"type": "rep", "rep": ana.email}})
    lead = _lead(employees=5000)
    decisions.route_lead(lead=lead)

    moved = lead_reassign(lead_id=lead.pk, rep_email=ben.email, reason="holiday", actor="test")

    assert moved.rep_id == ben.pk
    assert (moved.priority, moved.tags) == ("hot", ["enterprise", "webinar"])


@pytest.mark.django_db
def test_setting_tags_again_removes_the_rows_of_tags_no_longer_given() -> None:
    lead = _lead()
    assert lead_tags_set(lead=lead, priority="hot", tags=["a", "b"]) is True
    assert lead_tags_set(lead=lead, priority="hot", tags=["a", "b"]) is False  # nothing to do
    assert lead_tags_set(lead=lead, priority=None, tags=["b", "c"]) is True
    stored = Lead.objects.get(pk=lead.pk)
    assert (stored.priority, stored.tags) == ("", ["b", "c"])
    assert _tag_rows(stored) == {"b", "c"}
    assert lead_tags_set(lead=lead, priority="", tags=[]) is True
    assert _tag_rows(Lead.objects.get(pk=lead.pk)) == set()


@pytest.mark.django_db
def test_overlong_priorities_and_tags_are_cut_to_their_columns() -> None:
    lead = _lead()
    lead_tags_set(lead=lead, priority="p" * 500, tags=["t" * 500, "u"])
    stored = Lead.objects.get(pk=lead.pk)
    assert stored.priority == "p" * PRIORITY_MAX_LENGTH
    assert stored.tags == ["t" * TAG_MAX_LENGTH, "u"]


@given(st.lists(st.text(max_size=150), max_size=80))
def test_tags_clean_keeps_only_bounded_distinct_non_empty_tags(tags: list[str]) -> None:
    kept = tags_clean(tags)
    assert len(kept) == len(set(kept)) <= MAX_TAGS
    assert all(0 < len(tag) <= TAG_MAX_LENGTH and tag == tag.strip() for tag in kept)
    # Order is kept: each kept tag comes from the input, in the order first seen.
    firsts = [t.strip()[:TAG_MAX_LENGTH].rstrip() for t in tags if t.strip()]
    assert kept == list(dict.fromkeys(firsts))[:MAX_TAGS]


@given(st.one_of(st.none(), st.text(max_size=200)))
def test_priority_clean_is_bounded_and_idempotent(priority: str | None) -> None:
    value = priority_clean(priority)
    assert len(value) <= PRIORITY_MAX_LENGTH
    assert priority_clean(value) == value.strip()


def test_high_priorities_match_in_any_case() -> None:
    assert priority_is_high("HOT", ["hot", "urgent"])
    assert priority_is_high(" Urgent ", ["hot", "urgent"])
    assert not priority_is_high("normal", ["hot", "urgent"])
    assert not priority_is_high("", ["", "hot"])
    assert not priority_is_high(None, ["hot"])


def _routed(**payload: Any) -> Lead:
    """A lead through the pipeline, which writes its routing event."""
    lead = cast(Lead, LeadFactory(source=SourceFactory(slug="webform"), raw_payload=payload))
    lead_process(lead_id=lead.pk)
    return Lead.objects.get(pk=lead.pk)


def _as_before_the_columns(*leads: Lead) -> None:
    """What a lead routed before ``leads 0014`` looks like: its priority and tags only in its
    routing event."""
    ids = [lead.pk for lead in leads]
    Lead.objects.filter(pk__in=ids).update(priority="", tags=[])
    LeadTag.objects.filter(lead_id__in=ids).delete()
    Assignment.objects.filter(lead_id__in=ids).update(priority="", tags=[])


@pytest.mark.django_db
def test_the_backfill_reads_leads_routed_before_the_columns_back_from_their_events() -> None:
    ana = make_rep(email="ana@x.example")
    published_ruleset(*HOT_RULES, {"name": "Ana", "action": {"type": "rep", "rep": ana.email}})
    hot = _routed(email="hot@corp.example", employees=5000, country="Germany")
    plain = _routed(email="plain@corp.example", employees=10)
    _as_before_the_columns(hot, plain)

    counts = priority_tags_backfill(django_apps, batch_size=1)  # every batch boundary crossed

    stored = Lead.objects.get(pk=hot.pk)
    assert (stored.priority, stored.tags) == ("hot", ["enterprise", "webinar", "dach"])
    assert _tag_rows(stored) == {"enterprise", "webinar", "dach"}
    assignment = Assignment.objects.get(lead=hot)
    assert (assignment.priority, assignment.tags) == ("hot", ["enterprise", "webinar", "dach"])
    untouched = Lead.objects.get(pk=plain.pk)
    assert (untouched.priority, untouched.tags) == ("", [])
    assert (counts.leads, counts.assignments, counts.tag_rows) == (1, 1, 3)
    # Run again (the migration on a database that has it): nothing changes.
    assert priority_tags_backfill(django_apps).leads == 0


@pytest.mark.django_db
def test_the_backfill_takes_the_last_routing_event_and_leaves_tagged_leads_alone() -> None:
    published_ruleset(*HOT_RULES, {"name": "Nobody", "action": {"type": "exclude", "reason": "x"}})
    retagged = _routed(email="again@corp.example", employees=5000)
    kept = _routed(email="kept@corp.example", employees=5000)
    _as_before_the_columns(retagged)
    # Routed again later with no tag rule matching: its last event carries none.
    event_record(
        type=EventType.UNASSIGNED,
        lead_id=retagged.pk,
        data={"reason": "no rule", "tags": [], "priority": None},
    )
    Lead.objects.filter(pk=kept.pk).update(priority="warm")  # set since: not overwritten

    assert priority_tags_backfill(django_apps).leads == 0
    assert (Lead.objects.get(pk=retagged.pk).priority, Lead.objects.get(pk=kept.pk).priority) == (
        "",
        "warm",
    )
