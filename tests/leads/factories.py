"""Factories for the leads app."""

from __future__ import annotations

import factory
from django.utils import timezone

from audit.services import events_record_received
from leads.models import Lead, LeadStatus, Source, token_digest


class SourceFactory(factory.django.DjangoModelFactory):
    """A source whose token is ``token-<slug>`` (tests know it; the database keeps its hash)."""

    class Meta:
        model = Source
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"source-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.replace("-", " ").title())
    token_hash = factory.LazyAttribute(lambda o: token_digest(f"token-{o.slug}"))
    token_hint = factory.LazyAttribute(lambda o: f"token-{o.slug}"[:6])
    rate_limit_per_minute = 100_000


class LeadFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Lead
        skip_postgeneration_save = True

    source = factory.SubFactory(SourceFactory)
    status = LeadStatus.RECEIVED
    raw_payload = factory.Sequence(lambda n: {"email": f"person{n}@example.com"})
    request_fingerprint = factory.Sequence(lambda n: f"{n:064x}")
    received_at = factory.LazyFunction(timezone.now)
    # A lead made "received an hour ago" has waited an hour (unless a test says otherwise).
    queued_at = factory.SelfAttribute("received_at")

    @factory.post_generation
    def received_event(obj: Lead, create: bool, extracted: object, **kwargs: object) -> None:
        """Like the kickoff, start the lead's audit chain (``received_event=False`` skips it)."""
        if create and extracted is not False:
            events_record_received(leads=[obj], actor=f"source:{obj.source.slug}")
