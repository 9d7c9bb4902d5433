"""What a rep reads: e-mail (plain text and HTML), Slack and Teams bodies from a delivery's payload.

Pure functions of the frozen payload (``delivery_payload`` plus the ``notice`` part written when
the delivery was scheduled), so every retry renders the same message. Times are shown in the
rep's time zone with the zone named ("Thu 3 Dec 2026, 19:30 CET (Europe/Berlin)").
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, datetime
from typing import Any

from django.template.loader import render_to_string

EVENT_ASSIGNED = "lead.assigned"
EVENT_REASSIGNED = "lead.reassigned"
EVENT_SLA_WARNING = "lead.sla_warning"
EVENT_REASSIGNED_AWAY = "lead.reassigned_away"

SLACK_TEXT_LIMIT = 3000  # a section block's text (Slack's Block Kit reference)


def zone_of(name: str | None) -> zoneinfo.ZoneInfo:
    """The rep's zone; UTC when the name is empty or unknown (a notice never fails on it)."""
    try:
        return zoneinfo.ZoneInfo(name or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return zoneinfo.ZoneInfo("UTC")


def local_time(value: str | None, zone_name: str | None) -> str | None:
    """An ISO instant shown in ``zone_name``, the zone named: abbreviation and IANA name."""
    if not value:
        return None
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        return value
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    zone = zone_of(zone_name)
    local = instant.astimezone(zone)
    return f"{local:%a %d %b %Y, %H:%M} {local.tzname()} ({zone.key})"


def _lead_who(payload: dict[str, Any]) -> tuple[str, str]:
    lead = payload["data"]["lead"]
    fields = lead.get("fields") or {}
    name = " ".join(
        str(part) for part in (fields.get("first_name"), fields.get("last_name")) if part
    )
    who = name or str(fields.get("email") or "") or str(lead["id"])
    return who, str(fields.get("company") or "")


def notice_facts(payload: dict[str, Any]) -> dict[str, Any]:
    """Everything a message shows, as plain values (the template's and the chat bodies' input)."""
    data = payload["data"]
    lead = data["lead"]
    assignment = data["assignment"]
    notice = payload.get("notice") or {}
    fields = lead.get("fields") or {}
    rep = notice.get("rep") or assignment["rep"]
    zone = notice.get("timezone") or "UTC"
    who, company = _lead_who(payload)
    event = notice.get("event") or payload["type"]
    priority = assignment.get("priority") or None
    tags = list(assignment.get("tags") or [])
    # A message to the rep alone says "you"; one in a channel the whole team reads (``shared``)
    # names the rep, or it would read as every reader's lead.
    rep_name = rep.get("name") or rep.get("email") or "the rep"
    shared = bool(notice.get("shared"))
    you = rep_name if shared else "you"
    if event == EVENT_SLA_WARNING:
        headline = f"SLA about to breach: {who}" + (f" ({rep_name}'s lead)" if shared else "")
        intro = "The first-touch SLA of this lead is about to run out."
    elif event == EVENT_REASSIGNED_AWAY:
        headline = f"Lead reassigned away from {you}: {who}"
        now_with = notice.get("now_with") or "another rep"
        intro = (
            f"This lead is no longer {rep_name}'s" if shared else "This lead is no longer yours"
        ) + f": it now belongs to {now_with}."
    elif event == EVENT_REASSIGNED:
        headline = f"New lead reassigned to {you}: {who}"
        intro = f"A lead was reassigned to {you}."
    else:
        headline = f"New lead assigned to {you}: {who}"
        intro = f"A lead was assigned to {you}."
    if company:
        headline += f" ({company})"
    # One line: a name typed with a line break must not break the e-mail's Subject header.
    headline = " ".join(headline.split())
    sla_due = local_time(assignment.get("sla_due_at"), zone)
    return {
        "event": event,
        "headline": headline,
        "subject": " ".join(((f"[{priority}] " if priority else "") + headline).split()),
        "intro": intro,
        "rep_name": rep.get("name") or rep.get("email") or "",
        "who": who,
        "email": fields.get("email") or "—",
        "company": company or "—",
        "country": fields.get("country") or "—",
        "reason": assignment.get("reason") or "—",
        "team": (assignment.get("team") or {}).get("name") or "—",
        "priority": priority,
        "tags": tags,
        "sla_due": sla_due,
        "assigned_at": local_time(assignment.get("assigned_at"), zone),
        "timezone": zone_of(zone).key,
        "link": notice.get("link") or "",
        # The one-click "I'm on it" link (routing.rep_access), on the owner's messages only.
        "touch_link": notice.get("touch_link") or "",
    }


def email_text(facts: dict[str, Any]) -> str:
    """The plain-text part of the e-mail."""
    lines = [
        f"Hello {facts['rep_name']},",
        "",
        facts["intro"],
        "",
        f"Lead:      {facts['who']}",
        f"E-mail:    {facts['email']}",
        f"Company:   {facts['company']}",
        f"Country:   {facts['country']}",
        f"Reason:    {facts['reason']}",
        f"SLA due:   {facts['sla_due'] or 'no SLA'}",
        f"Team:      {facts['team']}",
        f"Priority:  {facts['priority'] or '—'}",
        f"Tags:      {', '.join(facts['tags']) or '—'}",
        "",
        f"Lead page: {facts['link']}",
    ]
    if facts["touch_link"]:
        lines += ["", f"I'm on it (one click records your first touch): {facts['touch_link']}"]
    return "\n".join(lines) + "\n"


def email_parts(payload: dict[str, Any]) -> tuple[str, str, str]:
    """Subject, plain text and HTML of the e-mail to the rep."""
    facts = notice_facts(payload)
    html = render_to_string("delivery/notice_email.html", facts)
    return facts["subject"], email_text(facts), html


def _slack_escape(text: str) -> str:
    # Slack's mrkdwn treats &, < and > as control characters ("Formatting text for app
    # surfaces"): escaped, a lead's name can neither ping @channel nor forge a link.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_message(payload: dict[str, Any]) -> dict[str, Any]:
    """``text`` (the notification and fallback) and ``blocks`` for chat.postMessage / a webhook."""
    facts = notice_facts(payload)
    escape = _slack_escape
    lines = [
        f"*{escape(facts['headline'])}*",
        escape(facts["intro"]),
        f"*Company:* {escape(facts['company'])}   *E-mail:* {escape(str(facts['email']))}",
        f"*Priority:* {escape(facts['priority'] or '—')}   "
        f"*Tags:* {escape(', '.join(facts['tags']) or '—')}",
        f"*SLA due:* {escape(facts['sla_due'] or 'no SLA')}",
        f"*Team:* {escape(facts['team'])}",
    ]
    link = facts["link"]
    if link.startswith(("https://", "http://")):
        lines.append(f"<{link}|Open the lead>")
    elif link:
        lines.append(escape(link))
    touch = facts["touch_link"]
    if touch.startswith(("https://", "http://")):
        lines.append(f"<{touch}|I'm on it> (records your first touch)")
    elif touch:
        lines.append(f"I'm on it: {escape(touch)}")
    section = "\n".join(lines)[:SLACK_TEXT_LIMIT]
    return {
        # The notification and channel preview read this as mrkdwn too: escaped like the block,
        # or a lead named "<!channel>" would ping a team's whole channel.
        "text": escape(facts["subject"]),
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": section}}],
    }


_TEAMS_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\*_[]`~"})


def _teams_escape(text: str) -> str:
    """Text for a TextBlock or FactSet value, which Adaptive Cards read as Markdown (bold,
    italic, lists and ``[text](url)`` links): what a lead typed can neither make a clickable
    link in a team's channel nor bold itself. Escaping ``[`` and ``]`` is enough against links
    (parentheses then mean nothing); the lead page and the touch link are card actions."""
    return text.translate(_TEAMS_MARKDOWN)


def teams_message(payload: dict[str, Any]) -> dict[str, Any]:
    """A Teams incoming-webhook body: a message with one Adaptive Card attachment.

    The shape both the Workflows webhooks and the older Office 365 connectors accept
    ("Create and send messages", Microsoft Learn). Every text is Markdown-escaped.
    """
    plain = notice_facts(payload)
    facts = {
        key: _teams_escape(value)
        if isinstance(value, str) and key not in ("link", "touch_link")
        else value
        for key, value in plain.items()
    }
    facts["tags"] = [_teams_escape(tag) for tag in plain["tags"]]
    summary = plain["subject"]  # plain text: the notification's preview, not Markdown
    card: dict[str, Any] = {
        "$schema": "http://adaptivecards.io/schemas/adaptive-card.json",
        "type": "AdaptiveCard",
        "version": "1.4",
        "body": [
            {
                "type": "TextBlock",
                "text": facts["subject"],
                "weight": "Bolder",
                "size": "Medium",
                "wrap": True,
            },
            {"type": "TextBlock", "text": facts["intro"], "wrap": True},
            {
                "type": "FactSet",
                "facts": [
                    {"title": "Company", "value": facts["company"]},
                    {"title": "E-mail", "value": str(facts["email"])},
                    {"title": "Priority", "value": facts["priority"] or "—"},
                    {"title": "Tags", "value": ", ".join(facts["tags"]) or "—"},
                    {"title": "SLA due", "value": facts["sla_due"] or "no SLA"},
                    {"title": "Team", "value": facts["team"]},
                ],
            },
        ],
    }
    actions = [
        {"type": "Action.OpenUrl", "title": title, "url": url}
        for title, url in (("I'm on it", facts["touch_link"]), ("Open the lead", facts["link"]))
        if url.startswith(("https://", "http://"))
    ]
    if actions:
        card["actions"] = actions
    return {
        "type": "message",
        "summary": summary,
        "attachments": [
            {
                "contentType": "application/vnd.microsoft.card.adaptive",
                "contentUrl": None,
                "content": card,
            }
        ],
    }
