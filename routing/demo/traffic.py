"""Demo traffic: realistic leads posted to a running LeadRouter over HTTP, and what became of them.

Three parts, each usable alone:
- ``LeadMaker`` makes leads as the demo's two sources send them (the website form's and the
  webinar platform's own field names): people at plausible companies in weighted countries, with
  a share of duplicates (the same person again, e-mail in other case, maybe from the other
  source), junk, competitors, free-mail addresses and named-account contacts. Seeded, so a run
  can be repeated.
- ``traffic_post`` posts them over HTTP at a steady rate or as a spike (as fast as ``concurrency``
  connections allow), with a progress line.
- ``traffic_outcomes`` reads back, over the lead API, what routing made of every accepted lead,
  and ``summary_lines`` says it in a few lines (accepted, assigned per team, duplicates, excluded,
  unassigned, p95 from accept to assigned).
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TextIO

import httpx

from routing.demo import company

FINAL = frozenset({"assigned", "duplicate", "excluded", "unassigned", "failed"})

FIRST_NAMES = {
    "US": ("Emma", "Olivia", "James", "Michael", "Sophia", "Ethan", "Ava", "Daniel", "Grace"),
    "CA": ("Chloe", "Liam", "Nathan", "Zoe", "Owen", "Maya"),
    "GB": ("Oliver", "Amelia", "Harry", "Isla", "George", "Poppy"),
    "IE": ("Aoife", "Cian", "Niamh", "Sean"),
    "DE": ("Lukas", "Lena", "Jonas", "Mia", "Felix", "Hannah", "Paul", "Lea"),
    "AT": ("Tobias", "Anna", "Florian", "Katharina"),
    "CH": ("Luca", "Nina", "Matteo", "Laura"),
    "FR": ("Louis", "Camille", "Hugo", "Chloé", "Arthur", "Léa"),
    "NL": ("Daan", "Sanne", "Bram", "Fleur"),
    "SE": ("Erik", "Astrid", "Oskar", "Elsa"),
    "ES": ("Javier", "Lucía", "Pablo", "Carmen"),
    "JP": ("Haruto", "Yui", "Sota", "Aoi"),
    "AU": ("Jack", "Charlotte", "William", "Ruby"),
    "IN": ("Aarav", "Ananya", "Vivaan", "Diya"),
    "BR": ("Gabriel", "Beatriz", "Lucas", "Júlia"),
}
LAST_NAMES = {
    "US": ("Smith", "Johnson", "Williams", "Brown", "Miller", "Davis", "Garcia", "Lee"),
    "CA": ("Tremblay", "Roy", "Wilson", "Martin"),
    "GB": ("Taylor", "Jones", "Evans", "Hughes", "Wright"),
    "IE": ("Murphy", "Kelly", "O'Brien", "Walsh"),
    "DE": ("Müller", "Schmidt", "Schneider", "Fischer", "Weber", "Becker", "Wagner"),
    "AT": ("Gruber", "Huber", "Bauer", "Pichler"),
    "CH": ("Meier", "Keller", "Frei", "Brunner"),
    "FR": ("Martin", "Bernard", "Dubois", "Lefèvre", "Moreau"),
    "NL": ("de Jong", "Jansen", "de Vries", "Bakker"),
    "SE": ("Andersson", "Johansson", "Karlsson", "Nilsson"),
    "ES": ("García", "Fernández", "López", "Martínez"),
    "JP": ("Sato", "Suzuki", "Takahashi", "Tanaka"),
    "AU": ("Smith", "Jones", "Williams", "Brown"),
    "IN": ("Sharma", "Patel", "Iyer", "Reddy"),
    "BR": ("Silva", "Santos", "Oliveira", "Souza"),
}
# Country weights: where a B2B SaaS company's inbound comes from.
COUNTRY_WEIGHTS = (
    ("US", 34),
    ("DE", 10),
    ("GB", 8),
    ("FR", 6),
    ("CA", 6),
    ("NL", 4),
    ("SE", 3),
    ("ES", 3),
    ("AT", 2),
    ("CH", 2),
    ("IE", 2),
    ("JP", 5),
    ("AU", 5),
    ("IN", 6),
    ("BR", 4),
)
# US (state, ZIP) samples: some in the Bay Area and New York City postal-prefix territories.
US_PLACES = (
    ("CA", "94105"),
    ("CA", "94301"),
    ("CA", "90012"),
    ("NY", "10001"),
    ("NY", "11201"),
    ("NY", "14604"),
    ("TX", "73301"),
    ("TX", "77002"),
    ("IL", "60601"),
    ("WA", "98101"),
    ("MA", "02110"),
    ("GA", "30303"),
    ("CO", "80202"),
    ("FL", "33101"),
    ("", ""),
)
DE_POSTCODES = ("10115", "12043", "13353", "80331", "20095", "50667", "60311", "70173")
COMPANY_WORDS = (
    ("Blue", "Bright", "North", "Silver", "Rapid", "Clear", "Green", "Open", "Iron", "Quantum"),
    ("Harbor", "Peak", "Field", "Stack", "Loop", "Forge", "Wave", "Grid", "Bridge", "Signal"),
    ("Labs", "Systems", "Analytics", "Logistics", "Health", "Retail", "Software", "Group"),
)
TLD = {"DE": "de", "GB": "co.uk", "FR": "fr", "NL": "nl", "SE": "se", "ES": "es", "JP": "jp"}
TITLES = ("Head of Sales", "CTO", "VP Marketing", "Operations Manager", "Founder", "Engineer")
EMPLOYEES = ((8, 20), (35, 25), (120, 25), (400, 15), (1500, 8), (8000, 5), (40000, 2))

# What a lead is meant to show, and its share of the traffic (the rest are ordinary new leads).
KIND_SHARES = (
    ("duplicate", 0.08),
    ("competitor", 0.03),
    ("junk", 0.03),
    ("rejected", 0.02),
    ("free_mail", 0.10),
    ("named_account", 0.08),
)


@dataclass(frozen=True)
class MadeLead:
    kind: str  # "new", or one of KIND_SHARES' kinds
    source: str  # source slug
    payload: dict[str, Any]


@dataclass
class _Person:
    first: str
    last: str
    email: str
    company: str
    country: str


class LeadMaker:
    """Makes demo leads, the same ones for the same seed."""

    def __init__(self, *, seed: int = 1, webinar_share: float = 0.3) -> None:
        self.rng = random.Random(seed)  # noqa: S311  # demo data, not secrets
        self.webinar_share = webinar_share
        self.people: list[_Person] = []  # earlier leads, for duplicates
        self.serial = 0

    def __iter__(self) -> Iterator[MadeLead]:
        while True:
            yield self.make()

    def _kind(self) -> str:
        roll = self.rng.random()
        for kind, share in KIND_SHARES:
            if roll < share:
                return kind if (kind != "duplicate" or self.people) else "new"
            roll -= share
        return "new"

    def _source(self) -> str:
        if self.rng.random() < self.webinar_share:
            return company.WEBINAR_SOURCE
        return company.FORM_SOURCE

    def make(self) -> MadeLead:
        self.serial += 1
        kind = self._kind()
        source = self._source()
        rng = self.rng
        if kind == "duplicate":
            person = rng.choice(self.people)
            email = person.email.upper() if rng.random() < 0.5 else person.email
            fields = self._fields(person, email=email)
            return MadeLead(kind, source, _shaped(source, fields))
        if kind == "rejected":  # no e-mail, no phone, no company and name: intake refuses it
            return MadeLead(kind, source, _shaped(source, {"title": "Curious visitor"}))
        country = _weighted(rng, COUNTRY_WEIGHTS)
        first = rng.choice(FIRST_NAMES[country])
        last = rng.choice(LAST_NAMES[country])
        words = [rng.choice(group) for group in COMPANY_WORDS]
        org = " ".join(words)
        domain = f"{words[0]}{words[1]}-{self.serial}.{TLD.get(country, 'com')}".lower()
        if kind == "competitor":
            domain = rng.choice(company.COMPETITORS)
            org = domain.split(".")[0].title()
        elif kind == "free_mail":
            domain = rng.choice(company.FREE_MAIL[:8])
        elif kind == "named_account":
            domain, org, _, _ = rng.choice(company.ACCOUNTS)
        elif kind == "junk":
            first, org = "test", rng.choice(("test", "asdf", "qwerty"))
        local = _ascii(f"{first}.{last}").lower().replace(" ", "").replace("'", "")
        person = _Person(first, last, f"{local}{self.serial}@{domain}", org, country)
        if kind in ("new", "named_account", "free_mail"):
            self.people.append(person)
        return MadeLead(kind, source, _shaped(source, self._fields(person, email=person.email)))

    def _fields(self, person: _Person, *, email: str) -> dict[str, Any]:
        rng = self.rng
        fields: dict[str, Any] = {
            "email": email,
            "first_name": person.first,
            "last_name": person.last,
            "company": person.company,
            "country": person.country,
            "title": rng.choice(TITLES),
            "employees": _weighted(rng, EMPLOYEES),
            "lead_score": min(100, max(0, int(rng.gauss(50, 22)))),
        }
        if person.country == "US":
            state, zip_code = rng.choice(US_PLACES)
            fields["region"], fields["postal_code"] = state, zip_code
        elif person.country == "DE":
            fields["postal_code"] = rng.choice(DE_POSTCODES)
        return fields


def _weighted(rng: random.Random, choices: Sequence[tuple[Any, int]]) -> Any:
    values, weights = zip(*choices, strict=True)
    return rng.choices(values, weights=weights)[0]


_ASCII = str.maketrans({"ä": "a", "ö": "o", "ü": "u", "é": "e", "è": "e", "í": "i", "ú": "u"})


def _ascii(text: str) -> str:
    return text.translate(_ASCII).encode("ascii", "ignore").decode()


def _shaped(source: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The canonical fields under the names the source's own tool uses."""
    if source == company.WEBINAR_SOURCE:
        names = {v: k for k, v in company.WEBINAR_FIELD_MAP.items()}
        out = {
            names.get(k, k): v for k, v in fields.items() if k not in ("first_name", "last_name")
        }
        if "first_name" in fields:
            out["Attendee Name"] = f"{fields['first_name']} {fields['last_name']}"
        out.pop("region", None)
        out.pop("postal_code", None)
        return out
    names = {v: k for k, v in company.FORM_FIELD_MAP.items()}
    return {names.get(k, k): v for k, v in fields.items()}


# --- Posting ----------------------------------------------------------------------------------


@dataclass
class Sent:
    """One POST: what was sent, the answer, and when."""

    lead: MadeLead
    status: int  # HTTP status; 0 when the request itself failed
    lead_id: str | None
    error: str
    seconds: float  # client-side time to the answer


@dataclass
class PostResult:
    sent: list[Sent] = field(default_factory=list)
    started: float = 0.0
    elapsed: float = 0.0

    @property
    def accepted(self) -> list[Sent]:
        return [s for s in self.sent if s.status == 202 and s.lead_id]


class Progress:
    """A one-line progress bar on a terminal; a line every tenth of the way elsewhere."""

    def __init__(self, total: int, out: TextIO, label: str) -> None:
        self.total, self.out, self.label = total, out, label
        self.done = 0
        self.failed = 0
        self.started = time.perf_counter()
        self.tty = out.isatty()
        self._lock = threading.Lock()
        self._last_tenth = -1

    def step(self, ok: bool) -> None:
        with self._lock:
            self.done += 1
            self.failed += not ok
            tenth = self.done * 10 // max(self.total, 1)
            if self.tty or tenth != self._last_tenth or self.done == self.total:
                self._last_tenth = tenth
                self._draw()

    def _draw(self) -> None:
        width = 30
        filled = width * self.done // max(self.total, 1)
        rate = self.done / max(time.perf_counter() - self.started, 1e-9)
        line = (
            f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            f"  not accepted {self.failed}  {rate:,.0f}/s"
        )
        if self.tty:
            self.out.write("\r" + line + ("\n" if self.done == self.total else ""))
        else:
            self.out.write(line + "\n")
        self.out.flush()


def _post_one(client: httpx.Client, base_url: str, tokens: dict[str, str], lead: MadeLead) -> Sent:
    started = time.perf_counter()
    try:
        response = client.post(
            f"{base_url}/api/v1/intake/{lead.source}/",
            json=lead.payload,
            headers={"Authorization": f"Bearer {tokens[lead.source]}"},
        )
    except httpx.HTTPError as exc:
        return Sent(lead, 0, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
    seconds = time.perf_counter() - started
    body: Any = None
    with contextlib.suppress(ValueError):
        body = response.json()
    lead_id = body.get("id") if isinstance(body, dict) and response.status_code == 202 else None
    error = ""
    if response.status_code != 202:
        err = body.get("error") if isinstance(body, dict) else None
        error = err.get("code", "") if isinstance(err, dict) else response.reason_phrase
    return Sent(lead, response.status_code, lead_id, error, seconds)


def traffic_post(
    *,
    base_url: str,
    tokens: dict[str, str],
    leads: Sequence[MadeLead],
    rate: float | None,
    concurrency: int = 16,
    out: TextIO = sys.stderr,
    client: httpx.Client | None = None,
) -> PostResult:
    """Post ``leads``: ``rate`` per second, or as fast as ``concurrency`` allows when None."""
    base_url = base_url.rstrip("/")
    progress = Progress(len(leads), out, "posting")
    result = PostResult(started=time.perf_counter())
    own = client is None
    http = client or httpx.Client(
        timeout=30.0,
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
    )
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = []
            for i, lead in enumerate(leads):
                if rate:
                    delay = result.started + i / rate - time.perf_counter()
                    if delay > 0:
                        time.sleep(delay)
                future = pool.submit(_post_one, http, base_url, tokens, lead)
                future.add_done_callback(lambda f: progress.step(f.result().status == 202))
                futures.append(future)
            result.sent = [f.result() for f in futures]
    finally:
        if own:
            http.close()
    result.elapsed = time.perf_counter() - result.started
    return result


# --- Outcomes ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    lead_id: str
    status: str
    team: str
    rep: str
    duplicate: bool
    to_assigned: float | None  # seconds from received to assigned, where it got an owner


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def outcome_of(document: dict[str, Any]) -> Outcome:
    """What routing made of a lead, from its ``GET /api/v1/leads/<id>/`` document."""
    assignment = document.get("assignment") or {}
    received = _parse_time(document.get("received_at"))
    assigned = _parse_time(assignment.get("assigned_at"))
    rep = assignment.get("rep") or {}
    return Outcome(
        lead_id=str(document.get("id")),
        status=str(document.get("status")),
        team=str(assignment.get("team") or ""),
        rep=str(rep.get("name") or ""),
        duplicate=bool(document.get("duplicate_of")),
        to_assigned=(assigned - received).total_seconds() if received and assigned else None,
    )


def traffic_outcomes(
    *,
    base_url: str,
    api_token: str,
    lead_ids: Sequence[str],
    wait_seconds: float = 120.0,
    concurrency: int = 8,
    out: TextIO = sys.stderr,
    client: httpx.Client | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Outcome]:
    """Poll each accepted lead until routing has finished with it, or ``wait_seconds`` pass.

    Leads still waiting at the end are returned with their current status.
    """
    base_url = base_url.rstrip("/")
    own = client is None
    http = client or httpx.Client(timeout=30.0)
    headers = {"Authorization": f"Token {api_token}"}
    outcomes: dict[str, Outcome] = {}
    pending = list(lead_ids)
    deadline = time.monotonic() + wait_seconds

    def fetch(lead_id: str) -> Outcome | None:
        try:
            response = http.get(f"{base_url}/api/v1/leads/{lead_id}/", headers=headers)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return outcome_of(response.json())

    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            while pending:
                for lead_id, outcome in zip(pending, pool.map(fetch, pending), strict=True):
                    if outcome is not None:
                        outcomes[lead_id] = outcome
                pending = [
                    i for i in pending if i not in outcomes or outcomes[i].status not in FINAL
                ]
                done = len(lead_ids) - len(pending)
                out.write(f"routed {done}/{len(lead_ids)}\n")
                out.flush()
                if not pending or time.monotonic() >= deadline:
                    break
                sleep(1.0)
    finally:
        if own:
            http.close()
    return outcomes


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summary_lines(posted: PostResult, outcomes: dict[str, Outcome] | None) -> list[str]:
    """The closing summary, a line per fact."""
    sent = posted.sent
    accepted = posted.accepted
    refused = Counter(f"{s.status} {s.error}".strip() for s in sent if s.status != 202)
    latencies = [s.seconds for s in sent if s.status == 202]
    lines = [
        f"posted {len(sent)} leads in {posted.elapsed:.1f} s "
        f"({len(sent) / max(posted.elapsed, 1e-9):,.0f}/s): accepted {len(accepted)}, "
        f"not accepted {len(sent) - len(accepted)}"
        + (f" ({', '.join(f'{n} x {why}' for why, n in refused.most_common())})" if refused else "")
    ]
    if latencies:
        lines.append(
            f"accept latency: p50 {_percentile(latencies, 0.5) * 1000:.0f} ms, "
            f"p99 {_percentile(latencies, 0.99) * 1000:.0f} ms"
        )
    if outcomes is None:
        return lines
    known = [outcomes[s.lead_id] for s in accepted if s.lead_id in outcomes]
    statuses = Counter(o.status for o in known)
    owned = [o for o in known if o.to_assigned is not None or o.rep]
    teams = Counter(o.team for o in owned if o.team)
    to_rep = sum(1 for o in owned if not o.team)  # a rep, territory-rep or account-owner rule
    waiting = len(accepted) - sum(statuses[s] for s in FINAL)
    per_team = [f"{team} {n}" for team, n in sorted(teams.items())]
    if to_rep:
        per_team.append(f"straight to a named rep {to_rep}")
    lines.append("assigned per team: " + (", ".join(per_team) or "none"))
    lines.append(
        f"duplicates {statuses['duplicate']} (sticky to the original's owner), "
        f"excluded {statuses['excluded']}, unassigned {statuses['unassigned']}, "
        f"failed {statuses['failed']}, still waiting {waiting}"
    )
    to_assigned = [o.to_assigned for o in known if o.to_assigned is not None]
    if to_assigned:
        lines.append(
            f"accept to assigned: p50 {_percentile(to_assigned, 0.5) * 1000:,.0f} ms, "
            f"p95 {_percentile(to_assigned, 0.95) * 1000:,.0f} ms "
            f"({len(to_assigned)} leads with an owner)"
        )
    return lines
