"""Which priority a routing message is published at (issue 22 item 2): the pure step mapping
and what is read from a lead's row when it is queued again."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leads import lanes
from leads.services import lead_queue_facts, source_is_high
from tests.leads.factories import LeadFactory, SourceFactory


@given(lane=st.sampled_from([*lanes.LANES, "", "typo"]), high=st.booleans())
def test_a_lanes_steps_never_pass_a_more_urgent_lanes(lane: str, high: bool) -> None:
    """A worker polls step by step across its queues (realtime first): a message of a later
    lane is never at a lower step than any of an earlier lane, and high is below normal."""
    step = lanes.routing_priority(lane, high)
    assert step in lanes.PRIORITY_STEPS
    order = lanes.LANES.index(lanes.lane_clean(lane))
    for earlier in lanes.LANES[:order]:
        assert step >= max(lanes.routing_priority(earlier, h) for h in (True, False))
    assert lanes.routing_priority(lane, True) < lanes.routing_priority(lane, False)
    assert lanes.routing_priority(lane, high, (0, 3)) in (0, 3)  # fewer steps: the last


@pytest.mark.django_db
def test_the_leads_own_priority_else_its_sources_decides(settings) -> None:  # type: ignore[no-untyped-def]
    settings.HIGH_PRIORITIES = ["hot", "urgent"]
    demo = SourceFactory(slug="demo-request", intake_priority="Hot ")
    form = SourceFactory(slug="contact-us", intake_priority="")
    assert source_is_high(demo)
    assert not source_is_high(form)
    tagged_low = LeadFactory(source=demo, lane=lanes.REALTIME, priority="low")
    untagged = LeadFactory(source=demo, lane=lanes.BULK)
    urgent = LeadFactory(source=form, lane="", priority="URGENT")
    plain = LeadFactory(source=form, lane=lanes.NORMAL)
    missing = uuid.uuid4()
    facts = lead_queue_facts([tagged_low.pk, untagged.pk, urgent.pk, plain.pk, missing])
    assert facts == {
        str(tagged_low.pk): (lanes.REALTIME, False),  # a tag rule said low: not the source's hot
        str(untagged.pk): (lanes.BULK, True),  # no rule yet: its source's intake priority
        str(urgent.pk): (lanes.NORMAL, True),
        str(plain.pk): (lanes.NORMAL, False),
        str(missing): (lanes.NORMAL, False),
    }
