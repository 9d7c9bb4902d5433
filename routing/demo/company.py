"""The demo company: Northwind Cloud's routing, as one rules-as-code document.

``seed_demo`` imports it with ``rules_import`` (so the demo goes through the same validation and
upserts as any customer's file) and publishes its ruleset. Everything is plain data here; the
only thing that depends on "now" is the return date of the two reps who are out of office, which
the caller passes in so that re-running the seed keeps the dates it set the first time.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

WORK_WEEK = {"days": [1, 2, 3, 4, 5], "start": "08:30", "end": "17:30"}

# (e-mail local part, name, time zone, team, weight, max_open, max_per_day, out of office)
_REPS: tuple[tuple[str, str, str, str, int, int | None, int | None, bool], ...] = (
    # SDR EMEA: round robin across five reps in four countries.
    ("ana.schmidt", "Ana Schmidt", "Europe/Berlin", "SDR EMEA", 1, 150, 100, False),
    ("ben.walker", "Ben Walker", "Europe/London", "SDR EMEA", 1, 150, 100, False),
    ("cleo.martin", "Cleo Martin", "Europe/Paris", "SDR EMEA", 1, 150, 100, True),
    ("freya.lund", "Freya Lund", "Europe/Stockholm", "SDR EMEA", 1, 150, 100, False),
    ("diego.ruiz", "Diego Ruiz", "Europe/Madrid", "SDR EMEA", 1, 150, 100, False),
    # SDR NA: weighted; Maya is the senior SDR and takes two leads for everyone else's one.
    ("maya.johnson", "Maya Johnson", "America/New_York", "SDR NA", 2, 300, 200, False),
    ("liam.chen", "Liam Chen", "America/Los_Angeles", "SDR NA", 1, 150, 100, False),
    ("sofia.garcia", "Sofia Garcia", "America/Chicago", "SDR NA", 1, 150, 100, False),
    ("noah.brown", "Noah Brown", "America/New_York", "SDR NA", 1, 150, 100, True),
    ("ava.wilson", "Ava Wilson", "America/Denver", "SDR NA", 1, 150, 100, False),
    # Enterprise AE: least loaded; fewer, bigger deals, tighter caps.
    ("olivia.park", "Olivia Park", "America/New_York", "Enterprise AE", 1, 120, 60, False),
    ("lukas.weber", "Lukas Weber", "Europe/Zurich", "Enterprise AE", 1, 120, 60, False),
    ("priya.nair", "Priya Nair", "Asia/Singapore", "Enterprise AE", 1, 120, 60, False),
    # Inbound: the catch-all desk.
    ("sam.taylor", "Sam Taylor", "Europe/London", "Inbound", 1, None, None, False),
    ("jordan.lee", "Jordan Lee", "America/Toronto", "Inbound", 1, None, None, False),
)

REP_DOMAIN = "northwind.example.com"

TEAMS: tuple[tuple[str, str, int], ...] = (  # name, strategy, SLA minutes
    ("SDR EMEA", "round_robin", 60),
    ("SDR NA", "weighted", 60),
    ("Enterprise AE", "least_loaded", 120),
    ("Inbound", "round_robin", 240),
)

# Teams the demo's sales manager manages (the history and dashboard pages can be scoped to them).
MANAGED_TEAMS = ("SDR EMEA", "SDR NA")

US_EAST = [
    "CT",
    "DC",
    "DE",
    "FL",
    "GA",
    "MA",
    "MD",
    "ME",
    "NC",
    "NH",
    "NJ",
    "NY",
    "PA",
    "RI",
    "SC",
    "VA",
    "VT",
    "WV",
]
US_CENTRAL = [
    "AL",
    "AR",
    "IA",
    "IL",
    "IN",
    "KS",
    "KY",
    "LA",
    "MI",
    "MN",
    "MO",
    "MS",
    "ND",
    "NE",
    "OH",
    "OK",
    "SD",
    "TN",
    "TX",
    "WI",
]
US_WEST = ["AK", "AZ", "CA", "CO", "HI", "ID", "MT", "NM", "NV", "OR", "UT", "WA", "WY"]

# The postal-prefix table: ZIP3 areas with a named owner, more specific than the state territories.
BAY_AREA_ZIP3 = ("940", "941", "943", "944", "945", "946", "947", "948", "949", "950", "951")
NYC_ZIP3 = tuple(str(n) for n in range(100, 120))
BERLIN_PLZ2 = ("10", "12", "13", "14")

# (domain, name, owner local part, tier): named accounts owned by the enterprise AEs.
ACCOUNTS: tuple[tuple[str, str, str, str], ...] = (
    ("acme.com", "Acme Corporation", "olivia.park", "enterprise"),
    ("globex.com", "Globex", "olivia.park", "enterprise"),
    ("initech.com", "Initech", "olivia.park", "mid-market"),
    ("umbrella-corp.com", "Umbrella Corp", "olivia.park", "enterprise"),
    ("hooli.com", "Hooli", "olivia.park", "strategic"),
    ("piedpiper.com", "Pied Piper", "olivia.park", "mid-market"),
    ("stark-industries.com", "Stark Industries", "olivia.park", "strategic"),
    ("wayne-enterprises.com", "Wayne Enterprises", "olivia.park", "strategic"),
    ("soylent.com", "Soylent", "olivia.park", "mid-market"),
    ("massive-dynamic.com", "Massive Dynamic", "olivia.park", "enterprise"),
    ("vandelay.com", "Vandelay Industries", "olivia.park", "mid-market"),
    ("bluthco.com", "Bluth Company", "olivia.park", "mid-market"),
    ("siemgrid.de", "Siemgrid", "lukas.weber", "enterprise"),
    ("rheinwerk-logistik.de", "Rheinwerk Logistik", "lukas.weber", "enterprise"),
    ("alpenbank.ch", "Alpenbank", "lukas.weber", "strategic"),
    ("nordlicht-energie.de", "Nordlicht Energie", "lukas.weber", "mid-market"),
    ("bauhaus-soft.de", "Bauhaus Software", "lukas.weber", "mid-market"),
    ("lumiere-retail.fr", "Lumière Retail", "lukas.weber", "enterprise"),
    ("tulipa-bank.nl", "Tulipa Bank", "lukas.weber", "strategic"),
    ("fjordline-shipping.no", "Fjordline Shipping", "lukas.weber", "mid-market"),
    ("britannia-insure.co.uk", "Britannia Insurance", "lukas.weber", "enterprise"),
    ("iberica-telecom.es", "Ibérica Telecom", "lukas.weber", "enterprise"),
    ("merlion-capital.sg", "Merlion Capital", "priya.nair", "strategic"),
    ("sakura-robotics.jp", "Sakura Robotics", "priya.nair", "enterprise"),
    ("kangaroo-freight.com.au", "Kangaroo Freight", "priya.nair", "mid-market"),
    ("bharat-infotech.in", "Bharat Infotech", "priya.nair", "enterprise"),
    ("lotus-pay.com", "Lotus Pay", "priya.nair", "mid-market"),
    ("harbourview-health.co.nz", "Harbourview Health", "priya.nair", "mid-market"),
    ("jade-dragon-games.com", "Jade Dragon Games", "priya.nair", "enterprise"),
    ("seoul-semicon.kr", "Seoul Semicon", "priya.nair", "strategic"),
)

COMPETITORS = ("rival.io", "othercorp.com", "routewise.io", "leadflowhq.com")
FREE_MAIL = (
    "gmail.com",
    "googlemail.com",
    "yahoo.com",
    "hotmail.com",
    "outlook.com",
    "live.com",
    "icloud.com",
    "aol.com",
    "gmx.de",
    "web.de",
    "proton.me",
    "mail.ru",
)

FORM_SOURCE = "website-form"
WEBINAR_SOURCE = "webinar"

# How the form tool and the webinar platform name their fields (what their field maps undo).
FORM_FIELD_MAP = {
    "your-email": "email",
    "your-first-name": "first_name",
    "your-last-name": "last_name",
    "company-name": "company",
    "company-size": "employees",
    "country-code": "country",
    "state": "region",
    "zip": "postal_code",
    "hs-score": "lead_score",
}
WEBINAR_FIELD_MAP = {
    "Email Address": "email",
    "Attendee Name": "full_name",
    "Org": "company",
    "Job Title": "title",
    "Country/Region": "country",
    "Number of Employees": "employees",
    "Engagement Score": "lead_score",
}


def rep_email(local: str) -> str:
    return f"{local}@{REP_DOMAIN}"


def demo_rules() -> list[dict[str, Any]]:
    """The published ruleset: rules-format.md's example, for Northwind's four teams."""
    return [
        {
            "name": "Exclude competitors",
            "priority": 10,
            "when": {"all": [{"field": "email_domain", "op": "in_list", "value": "competitors"}]},
            "action": {"type": "exclude", "reason": "competitor"},
        },
        {
            "name": "Exclude test submissions",
            "priority": 15,
            "when": {
                "any": [
                    {"field": "company", "op": "matches", "value": r"^(test|asdf|qwerty|xxx+)\b"},
                    {"field": "first_name", "op": "in", "value": ["test", "asdf", "mickey"]},
                ]
            },
            "action": {"type": "exclude", "reason": "test or junk submission"},
        },
        {
            "name": "Free-mail, low intent",
            "priority": 18,
            "when": {
                "all": [
                    {"field": "email_domain", "op": "in_list", "value": "free-mail"},
                    {"field": "lead_score", "op": "lt", "value": 20},
                ]
            },
            "action": {"type": "exclude", "reason": "free-mail address with a low score"},
        },
        {
            "name": "Hot leads",
            "priority": 20,
            "when": {"all": [{"field": "lead_score", "op": "gte", "value": 80}]},
            "action": {"type": "tag", "priority": "hot", "sla_minutes": 5, "tags": ["hot"]},
        },
        {
            "name": "Named accounts",
            "priority": 30,
            "when": {"all": [{"field": "account.exists", "op": "eq", "value": True}]},
            "action": {"type": "account_owner", "fallback_team": "Enterprise AE"},
        },
        {
            "name": "Enterprise",
            "priority": 40,
            "when": {
                "any": [
                    {"field": "employees", "op": "gte", "value": 1000},
                    {"field": "account.tier", "op": "eq", "value": "enterprise"},
                ]
            },
            "action": {"type": "team", "team": "Enterprise AE"},
            "sla_minutes": 30,
            "on_sla_breach": "reassign",
        },
        {
            "name": "Free-mail to Inbound",
            "priority": 45,
            "when": {"all": [{"field": "is_free_email", "op": "eq", "value": True}]},
            "action": {"type": "team", "team": "Inbound"},
        },
        {"name": "By territory", "priority": 50, "action": {"type": "territory"}},
        {
            "name": "Catch-all",
            "priority": 1000,
            "action": {"type": "team", "team": "Inbound"},
        },
    ]


def demo_document(
    *,
    out_of_office_until: dict[str, datetime | None],
    source_tokens: dict[str, str],
) -> dict[str, Any]:
    """The whole demo as a rules document.

    ``out_of_office_until`` maps the e-mail of each rep marked out of office above to the moment
    they are back (the seed keeps whatever date it set before); ``source_tokens`` maps each source
    slug to the token a new source is given.
    """
    reps = []
    members: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in TEAMS}
    for local, name, tz, team, weight, max_open, max_per_day, away in _REPS:
        email = rep_email(local)
        back = out_of_office_until.get(email) if away else None
        reps.append(
            {
                "email": email,
                "name": name,
                "active": True,
                "out_of_office_until": back.isoformat() if back else None,
                "timezone": tz,
                "working_hours": WORK_WEEK,
                "max_open": max_open,
                "max_per_day": max_per_day,
            }
        )
        members[team].append({"rep": email, "weight": weight})
    return {
        "sources": [
            {
                "slug": FORM_SOURCE,
                "name": "Website demo-request form",
                "token": source_tokens[FORM_SOURCE],
                "field_map": FORM_FIELD_MAP,
                "rate_limit_per_minute": 6000,
            },
            {
                "slug": WEBINAR_SOURCE,
                "name": "Webinar platform attendee list",
                "token": source_tokens[WEBINAR_SOURCE],
                "field_map": WEBINAR_FIELD_MAP,
                "rate_limit_per_minute": 60000,
            },
        ],
        "reps": reps,
        "teams": [
            {
                "name": name,
                "strategy": strategy,
                "respect_working_hours": False,
                "sla_minutes": sla,
                "members": members[name],
            }
            for name, strategy, sla in TEAMS
        ],
        "territories": [
            {
                "name": "Berlin",
                "countries": ["DE"],
                "postal_prefixes": list(BERLIN_PLZ2),
                "rep": rep_email("ana.schmidt"),
            },
            {"name": "DACH", "countries": ["DE", "AT", "CH"], "team": "SDR EMEA"},
            {"name": "UK & Ireland", "countries": ["GB", "IE"], "team": "SDR EMEA"},
            {"name": "France & Benelux", "countries": ["FR", "BE", "NL", "LU"], "team": "SDR EMEA"},
            {"name": "Nordics", "countries": ["SE", "NO", "DK", "FI", "IS"], "team": "SDR EMEA"},
            {"name": "Southern Europe", "countries": ["ES", "PT", "IT"], "team": "SDR EMEA"},
            {
                "name": "Bay Area",
                "countries": ["US"],
                "postal_prefixes": list(BAY_AREA_ZIP3),
                "rep": rep_email("liam.chen"),
            },
            {
                "name": "New York City",
                "countries": ["US"],
                "postal_prefixes": list(NYC_ZIP3),
                "rep": rep_email("maya.johnson"),
            },
            {"name": "US East", "countries": ["US"], "regions": list(US_EAST), "team": "SDR NA"},
            {
                "name": "US Central",
                "countries": ["US"],
                "regions": list(US_CENTRAL),
                "team": "SDR NA",
            },
            {"name": "US West", "countries": ["US"], "regions": list(US_WEST), "team": "SDR NA"},
            {"name": "US (no state)", "countries": ["US"], "team": "SDR NA"},
            {"name": "Canada", "countries": ["CA"], "team": "SDR NA"},
        ],
        "accounts": [
            {"domain": domain, "name": name, "owner": rep_email(owner), "tier": tier}
            for domain, name, owner, tier in ACCOUNTS
        ],
        "value_lists": [
            {"name": "competitors", "values": list(COMPETITORS)},
            {"name": "free-mail", "values": list(FREE_MAIL)},
        ],
        "ruleset": {"name": "Northwind inbound routing", "rules": demo_rules()},
    }


AWAY_REPS = tuple(rep_email(r[0]) for r in _REPS if r[7])
ALL_REPS = tuple(rep_email(r[0]) for r in _REPS)

# Saved test cases: (name, source, lead as the source sends it, status, rep local part, team).
TEST_CASES: tuple[tuple[str, str | None, dict[str, Any], str, str | None, str | None], ...] = (
    (
        "Competitor is excluded",
        None,
        {"email": "spy@rival.io", "company": "Rival", "country": "US"},
        "excluded",
        None,
        None,
    ),
    (
        "Named account goes to its owner",
        None,
        {"email": "cfo@globex.com", "company": "Globex", "country": "US", "region": "CA"},
        "assigned",
        "olivia.park",
        None,
    ),
    (
        "Big company goes to Enterprise AE",
        None,
        {"email": "it@bigretail.com", "company": "Big Retail", "employees": 5000, "country": "FR"},
        "assigned",
        None,
        "Enterprise AE",
    ),
    (
        "German lead goes to SDR EMEA",
        None,
        {"email": "jonas@kleinbau.de", "company": "Kleinbau", "country": "DE", "employees": 40},
        "assigned",
        None,
        "SDR EMEA",
    ),
    (
        "Berlin postcode goes to Ana",
        FORM_SOURCE,
        {
            "your-email": "lea@spree-digital.de",
            "company-name": "Spree Digital",
            "country-code": "DE",
            "zip": "10115",
        },
        "assigned",
        "ana.schmidt",
        None,
    ),
    (
        "Bay Area ZIP goes to Liam",
        None,
        {"email": "kim@fogcity.io", "company": "Fog City", "country": "US", "postal_code": "94105"},
        "assigned",
        "liam.chen",
        None,
    ),
    (
        "Texas lead goes to SDR NA",
        None,
        {"email": "rae@lonestar.io", "company": "Lone Star", "country": "US", "region": "TX"},
        "assigned",
        None,
        "SDR NA",
    ),
    (
        "Free-mail with a low score is excluded",
        WEBINAR_SOURCE,
        {"Email Address": "someone@gmail.com", "Attendee Name": "Some One", "Engagement Score": 5},
        "excluded",
        None,
        None,
    ),
    (
        "Japan goes to the Inbound desk",
        None,
        {"email": "ken@tokyo-apps.jp", "company": "Tokyo Apps", "country": "JP"},
        "assigned",
        None,
        "Inbound",
    ),
)
