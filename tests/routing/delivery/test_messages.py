"""The rep's messages are pure functions of the payload: any lead text renders, escaped."""

from __future__ import annotations

import json
from typing import Any

from django.utils.html import escape
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.delivery.messages import email_parts, local_time, slack_message, teams_message

_text = st.text(max_size=80)


def _payload(fields: dict[str, Any], *, priority: str | None, tags: list[str], zone: str) -> dict:
    return {
        "type": "lead.assigned",
        "timestamp": "2026-12-03T10:00:00+00:00",
        "data": {
            "lead": {"id": "3f0c", "fields": fields},
            "assignment": {
                "rep": {"id": 1, "email": "rep@example.com", "name": "Rita"},
                "team": {"id": 1, "name": "EMEA"},
                "reason": "matched",
                "sla_due_at": "2026-07-01T12:00:00+00:00",
                "assigned_at": "2026-07-01T11:30:00+00:00",
                "priority": priority,
                "tags": tags,
            },
        },
        "notice": {"event": "lead.assigned", "timezone": zone, "link": "https://x.example/l/"},
    }


@settings(max_examples=150, deadline=None)
@given(
    first=_text,
    last=_text,
    company=_text,
    priority=st.none() | _text,
    tags=st.lists(_text, max_size=5),
    zone=st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Not/AZone", ""]),
)
def test_any_lead_text_renders_in_every_format(
    first: str, last: str, company: str, priority: str | None, tags: list[str], zone: str
) -> None:
    payload = _payload(
        {"first_name": first, "last_name": last, "company": company},
        priority=priority,
        tags=tags,
        zone=zone,
    )
    subject, text, html = email_parts(payload)
    assert "\n" not in subject
    assert "\r" not in subject
    assert "SLA due:" in text
    slack = slack_message(payload)
    section = slack["blocks"][0]["text"]["text"]
    # Only our own link may open a <...> in Slack's mrkdwn: the lead's text is escaped.
    assert section.count("<") == 1
    assert section.endswith("<https://x.example/l/|Open the lead>")
    assert len(section) <= 3000
    # The fallback text (the notification, a channel's preview) is mrkdwn too.
    assert "<" not in slack["text"]
    assert ">" not in slack["text"]
    json.dumps(teams_message(payload))
    if company:
        assert escape(company) in html


def test_times_name_the_zone_across_daylight_saving() -> None:
    assert local_time("2026-03-29T00:30:00+00:00", "Europe/Berlin") == (
        "Sun 29 Mar 2026, 01:30 CET (Europe/Berlin)"
    )
    assert local_time("2026-03-29T01:30:00+00:00", "Europe/Berlin") == (
        "Sun 29 Mar 2026, 03:30 CEST (Europe/Berlin)"
    )
    assert local_time("2026-03-29T01:30:00+00:00", "Not/AZone") == (
        "Sun 29 Mar 2026, 01:30 UTC (UTC)"
    )
    assert local_time(None, "UTC") is None


def test_a_lead_named_like_a_mention_pings_no_one_in_slack() -> None:
    payload = _payload(
        {"first_name": "<!channel>", "last_name": "<@U024BE7LH>", "company": "<!here> & Co"},
        priority="<!everyone>",
        tags=[],
        zone="UTC",
    )
    message = slack_message(payload)
    for text in (message["text"], message["blocks"][0]["text"]["text"]):
        for mention in ("<!channel>", "<@U024BE7LH>", "<!here>", "<!everyone>"):
            assert mention not in text
    assert message["text"] == (
        "[&lt;!everyone&gt;] New lead assigned to you: &lt;!channel&gt; &lt;@U024BE7LH&gt; "
        "(&lt;!here&gt; &amp; Co)"
    )


def _card_texts(body: dict[str, Any]) -> list[str]:
    card = body["attachments"][0]["content"]
    texts = [block["text"] for block in card["body"] if block["type"] == "TextBlock"]
    for block in card["body"]:
        if block["type"] == "FactSet":
            texts += [fact["value"] for fact in block["facts"]]
    return texts


def test_a_lead_cannot_put_a_link_or_emphasis_into_a_teams_card() -> None:
    """Adaptive Cards render Markdown in TextBlocks and FactSet values: a lead named
    "[Reset your password](https://evil.example)" became a clickable phishing link in the
    team's channel, and "**URGENT**" bold. What the lead typed is escaped; our own link is an
    action, never Markdown."""
    payload = _payload(
        {
            "first_name": "[Reset your password](https://evil.example/x)",
            "last_name": "**URGENT** _now_",
            "company": "[Acme](https://evil.example/c) \\",
        },
        priority="hot",
        tags=["[t](https://evil.example/t)"],
        zone="UTC",
    )
    texts = _card_texts(teams_message(payload))
    joined = "\n".join(texts)
    assert "](https://evil.example" not in joined.replace("\\](", "")
    assert "[Reset your password]" not in joined
    assert "\\[Reset your password\\](https://evil.example/x)" in joined
    assert "**URGENT**" not in joined
    assert "\\*\\*URGENT\\*\\* \\_now\\_" in joined
    assert "\\[Acme\\]" in joined
    assert "\\[t\\]" in joined


@settings(max_examples=150, deadline=None)
@given(first=_text, company=_text, tags=st.lists(_text, max_size=3))
def test_no_markdown_control_character_reaches_a_teams_card_unescaped(
    first: str, company: str, tags: list[str]
) -> None:
    payload = _payload(
        {"first_name": first, "company": company}, priority=None, tags=tags, zone="UTC"
    )
    for text in _card_texts(teams_message(payload)):
        i = 0
        while i < len(text):
            if text[i] == "\\":
                i += 2  # an escape and the character it escapes
                continue
            # Parentheses are harmless once no "]" can close a link text.
            assert text[i] not in "*_[]`~", (text, i)
            i += 1
