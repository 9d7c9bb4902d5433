"""Pages in the user's time zone: the user's choice, else the browser's (a cookie), else the
server's (PAGES_TIME_ZONE); history's days and the dashboard's buckets in that zone; history by
any owner a lead ever had."""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from audit import reports
from audit.models import UserSettings
from audit.timezones import TZ_COOKIE, ZoneSource, page_zone_resolve, zone_names
from leads.models import Lead, LeadStatus
from routing.services import lead_reassign
from tests.audit.test_pages import lead_ids, logged_in, manager, owned
from tests.leads.factories import LeadFactory
from tests.routing.factories import RepFactory, TeamFactory

pytestmark = pytest.mark.django_db

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")
KOLKATA = zoneinfo.ZoneInfo("Asia/Kolkata")


# --- Which zone -------------------------------------------------------------------------------


def test_the_users_choice_wins_then_the_browsers_then_the_servers(settings: Any) -> None:
    settings.PAGES_TIME_ZONE = "America/New_York"
    chosen = page_zone_resolve(user_choice="Europe/Berlin", cookie="Asia/Kolkata")
    assert (chosen.name, chosen.source) == ("Europe/Berlin", ZoneSource.USER)
    browser = page_zone_resolve(user_choice="", cookie="Asia/Kolkata")
    assert (browser.name, browser.source) == ("Asia/Kolkata", ZoneSource.BROWSER)
    server = page_zone_resolve(user_choice="", cookie=None)
    assert (server.name, server.source) == ("America/New_York", ZoneSource.SERVER)
    # A name zoneinfo does not know, from the browser or left in the settings: ignored.
    odd = page_zone_resolve(user_choice="Mars/Olympus", cookie="../../etc/passwd")
    assert (odd.name, odd.source) == ("America/New_York", ZoneSource.SERVER)


def test_a_server_zone_that_is_not_a_zone_falls_back_to_utc(settings: Any) -> None:
    settings.PAGES_TIME_ZONE = "Nowhere/Atlantis"
    assert page_zone_resolve(user_choice="", cookie=None).name == "UTC"


@hsettings(max_examples=200, deadline=None)
@given(choice=st.text(max_size=80), cookie=st.one_of(st.none(), st.text(max_size=200)))
def test_whatever_the_cookie_and_choice_hold_a_known_zone_comes_back(
    choice: str, cookie: str | None
) -> None:
    found = page_zone_resolve(user_choice=choice, cookie=cookie)
    assert found.name in zone_names()
    expected = ZoneSource.USER if choice in zone_names() else None
    if expected:
        assert found.source == expected


# --- Pages ------------------------------------------------------------------------------------


def _lead_at(received: datetime) -> Lead:
    rep = RepFactory(name="Ana")
    return owned(rep=rep, email="max@acme.com", received_at=received)


def test_the_lead_page_shows_times_in_the_users_zone_with_the_zone_named(client: Client) -> None:
    user = manager()
    lead = _lead_at(datetime(2026, 7, 1, 12, 0, tzinfo=UTC))
    UserSettings.objects.create(user=user, time_zone="Europe/Berlin")
    page = logged_in(client, user).get(f"/history/{lead.pk}/").content.decode()
    assert "2026-07-01 14:00:00 CEST" in page  # received, in summer time
    assert "Times in Europe/Berlin" in page
    assert 'data-tz="Europe/Berlin" data-tz-source="user"' in page


def test_without_a_choice_the_browsers_zone_is_used_and_a_bogus_one_is_ignored(
    client: Client,
) -> None:
    lead = _lead_at(datetime(2026, 1, 15, 20, 0, tzinfo=UTC))
    logged_in(client, manager())
    client.cookies[TZ_COOKIE] = "Asia/Kolkata"
    page = client.get(f"/history/{lead.pk}/").content.decode()
    assert "2026-01-16 01:30:00 IST" in page
    assert 'data-tz-source="browser"' in page
    client.cookies[TZ_COOKIE] = "<script>alert(1)</script>"
    response = client.get(f"/history/{lead.pk}/")
    assert response.status_code == 200
    page = response.content.decode()
    assert "2026-01-15 20:00:00 UTC" in page
    assert "alert(1)" not in page


def test_the_api_stays_in_utc_whatever_the_cookie(client: Client) -> None:
    lead = _lead_at(datetime(2026, 1, 15, 20, 0, tzinfo=UTC))
    user = manager()
    UserSettings.objects.create(user=user, time_zone="Asia/Kolkata")
    logged_in(client, user)
    client.cookies[TZ_COOKIE] = "Asia/Kolkata"
    body = client.get(f"/api/v1/leads/{lead.pk}/").json()
    assert body["received_at"].startswith("2026-01-15T20:00:00")
    assert body["received_at"].endswith(("Z", "+00:00"))


def test_a_user_sets_and_clears_their_zone_and_a_bad_name_is_refused(client: Client) -> None:
    user = manager()
    logged_in(client, user)
    client.cookies[TZ_COOKIE] = "Asia/Tokyo"
    form = client.get("/accounts/time-zone/")
    assert form.status_code == 200
    assert "My browser&#x27;s (Asia/Tokyo)" in form.content.decode()
    response = client.post("/accounts/time-zone/", {"time_zone": "America/Chicago"})
    assert response.status_code == 302
    assert UserSettings.objects.get(user=user).time_zone == "America/Chicago"
    assert 'data-tz="America/Chicago"' in client.get("/history/").content.decode()
    refused = client.post("/accounts/time-zone/", {"time_zone": "Mars/Olympus"})
    assert refused.status_code == 200
    assert refused.context["form"].errors
    assert UserSettings.objects.get(user=user).time_zone == "America/Chicago"
    client.post("/accounts/time-zone/", {"time_zone": ""})
    assert UserSettings.objects.get(user=user).time_zone == ""
    assert 'data-tz="Asia/Tokyo"' in client.get("/history/").content.decode()


def test_the_settings_page_needs_a_login(client: Client) -> None:
    response = client.get("/accounts/time-zone/")
    assert response.status_code == 302
    assert "/accounts/login/" in response["Location"]
    assert not User.objects.exists()


# --- History: local days, any past owner -------------------------------------------------------


def test_history_days_are_the_page_zones_days(client: Client) -> None:
    # 23:30 UTC on 1 March is 00:30 on 2 March in Berlin.
    lead = _lead_at(datetime(2026, 3, 1, 23, 30, tzinfo=UTC))
    user = manager()
    logged_in(client, user)
    assert lead_ids(client.get("/history/?since=2026-03-02")) == []
    assert lead_ids(client.get("/history/?until=2026-03-01")) == [str(lead.pk)]
    UserSettings.objects.create(user=user, time_zone="Europe/Berlin")
    assert lead_ids(client.get("/history/?since=2026-03-02")) == [str(lead.pk)]
    assert lead_ids(client.get("/history/?until=2026-03-01")) == []


def test_history_finds_a_lead_by_any_owner_it_ever_had(client: Client) -> None:
    logged_in(client, manager())
    ana, ben = RepFactory(name="Ana"), RepFactory(name="Ben")
    team = TeamFactory(name="EMEA")
    moved = owned(rep=ana, team=team, email="moved@acme.com")
    lead_reassign(lead_id=moved.pk, rep_email=ben.email, reason="moved", actor="user:mia")
    kept = owned(rep=ana, team=team, email="kept@acme.com")
    LeadFactory(status=LeadStatus.RECEIVED)
    assert set(lead_ids(client.get(f"/history/?rep={ana.pk}"))) == {str(kept.pk)}
    assert set(lead_ids(client.get(f"/history/?owned_by={ana.pk}"))) == {
        str(kept.pk),
        str(moved.pk),
    }
    assert set(lead_ids(client.get(f"/history/?owned_by={ben.pk}"))) == {str(moved.pk)}
    page = client.get("/history/").content.decode()
    assert ">Ever owned by:</label>" in page


# --- Dashboard buckets on the zone's wall clock ------------------------------------------------


ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney"]


@hsettings(max_examples=300, deadline=None)
@given(
    zone=st.sampled_from(ZONES),
    window=st.sampled_from(list(reports.WINDOWS)),
    now=st.datetimes(
        min_value=datetime(2025, 1, 1),  # noqa: DTZ001 - naive bounds, as hypothesis wants
        max_value=datetime(2028, 12, 31),  # noqa: DTZ001
        timezones=st.just(UTC),
    ),
)
def test_every_span_covers_now_with_increasing_edges_on_local_boundaries(
    zone: str, window: str, now: datetime
) -> None:
    w = reports.WINDOWS[window]
    bucket = reports.BUCKETS[w.bucket]
    tz = zoneinfo.ZoneInfo(zone)
    span = reports.span_of(w, bucket, now, tz)
    assert len(span.edges) == span.bars + 1
    assert all(a < b for a, b in zip(span.edges, span.edges[1:], strict=False))
    assert span.index_of(now) == span.bars - 1  # the last bar holds now
    assert span.index_of(span.start) == 0
    assert span.index_of(span.end) is None
    if bucket == reports.DAY:
        for edge in span.edges:
            local = edge.astimezone(tz)
            assert (local.hour, local.minute) == (0, 0), local


def test_day_bars_split_at_the_zones_midnight_and_hour_bars_at_its_hour() -> None:
    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    week = reports.WINDOWS["7d"]
    berlin = reports.span_of(week, reports.DAY, now, BERLIN)
    before = datetime(2026, 3, 9, 22, 59, tzinfo=UTC)  # 23:59 on the 9th in Berlin
    after = datetime(2026, 3, 9, 23, 1, tzinfo=UTC)  # 00:01 on the 10th in Berlin
    assert berlin.index_of(after) == berlin.index_of(before) + 1
    utc = reports.span_of(week, reports.DAY, now, UTC)
    assert utc.index_of(after) == utc.index_of(before)
    kolkata = reports.span_of(reports.WINDOWS["24h"], reports.HOUR, now, KOLKATA)
    assert {edge.minute for edge in kolkata.edges} == {30}  # local hours start at :30 UTC


def test_a_day_bar_across_the_spring_change_is_23_hours_and_counts_by_local_day() -> None:
    now = datetime(2026, 3, 31, 10, 0, tzinfo=UTC)
    span = reports.span_of(reports.WINDOWS["7d"], reports.DAY, now, BERLIN)
    lengths = {
        span.edges[i].astimezone(BERLIN).date(): span.edges[i + 1] - span.edges[i]
        for i in range(span.bars)
    }
    assert lengths[date(2026, 3, 29)] == timedelta(hours=23)
    assert lengths[date(2026, 3, 30)] == timedelta(hours=24)


def test_the_dashboard_counts_leads_in_the_bars_of_the_users_days(client: Client) -> None:
    user = manager()
    UserSettings.objects.create(user=user, time_zone="Europe/Berlin")
    logged_in(client, user)
    now = datetime.now(UTC)
    local_midnight = now.astimezone(BERLIN).replace(hour=0, minute=0, second=0, microsecond=0)
    for offset in (timedelta(minutes=-20), timedelta(minutes=20)):  # either side of it
        LeadFactory(received_at=local_midnight + offset)
    response = client.get("/dashboard/?window=7d&bucket=1d")
    assert response.status_code == 200
    d = response.context["d"]
    assert d.span.zone.key == "Europe/Berlin"
    values = [bar.height > 0 for bar in d.intake.bars]
    assert d.intake.total == 2
    assert len(values) == 2  # two bars drawn: the day before midnight and the day after
    assert "CET" in d.intake.end_label or "CEST" in d.intake.end_label


def test_the_admin_names_the_zone_its_times_are_in(client: Client, admin_user: Any) -> None:
    # docs/managers.md: every page, the admin too, shows times in one zone named in the top bar.
    client.force_login(admin_user)
    client.cookies[TZ_COOKIE] = "Asia/Tokyo"
    for path in ("/admin/", "/admin/leads/lead/", "/admin/audit/event/"):
        page = client.get(path)
        assert page.status_code == 200, path
        body = page.content.decode()
        assert 'id="admin-zone"' in body, path
        assert "Times in Asia/Tokyo" in body, path
        assert "/static/audit/tz.js" in body, path  # the browser's zone reaches the admin too
    UserSettings.objects.create(user=admin_user, time_zone="Europe/Berlin")
    assert "Times in Europe/Berlin" in client.get("/admin/").content.decode()
