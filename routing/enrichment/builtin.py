"""The built-in enrichment providers, run in the routing worker before the lead is routed.

Each looks at the normalised lead, may fill EMPTY canonical fields (never overwrites), and
records what it did in ``lead.enrichment[<name>]``. Free-mail / disposable detection and geo
normalisation happen in ``leads.normalize``; the providers here report and build on them rather
than doing them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import phonenumbers
from django.conf import settings

from leads.models import Lead
from leads.normalize import (
    FLAG_DISPOSABLE_EMAIL,
    FLAG_FREE_EMAIL,
    FLAG_INVALID_EMAIL,
    is_disposable_domain,
    is_free_email_domain,
)
from routing.decisions import account_for_domain
from routing.engine import AccountFacts
from routing.enrichment.merge import fill_empty
from routing.models import Account

logger = logging.getLogger(__name__)

HTTP_PROVIDER = "http"


@dataclass(frozen=True)
class ProviderResult:
    """What one provider did for one lead: its status, the fields it filled, what it found."""

    name: str
    status: str  # done | no_match | skipped | failed
    filled: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    summary: str = ""

    def as_json(self) -> dict[str, Any]:
        """The shape stored under ``lead.enrichment[name]``."""
        return {"status": self.status, "filled": list(self.filled), "data": dict(self.data)}


def _filled_note(filled: list[str]) -> str:
    return f"; filled {', '.join(filled)}" if filled else ""


# The accounts read already for a batch of leads (``routing.batch``): (domain -> facts, domain
# -> id) holding every account those leads' domains can match; None: read the table.
accounts_known: ContextVar[tuple[Mapping[str, AccountFacts], Mapping[str, int]] | None] = (
    ContextVar("accounts_known", default=None)
)


def provider_account(lead: Lead) -> ProviderResult:
    """Match the lead to a named account by its company domain, else a business e-mail domain.

    Subdomains match their parent (``eu.acme.com`` → ``acme.com``; the most specific account
    wins). Fills ``company`` from the account's name when the lead has none.
    """
    domain = lead.domain
    if not domain and lead.email_domain:
        business = not (
            is_free_email_domain(lead.email_domain) or is_disposable_domain(lead.email_domain)
        )
        domain = lead.email_domain if business else ""
    if not domain:
        return ProviderResult(
            "account", "skipped", summary="account: no company domain (free-mail or none)"
        )
    known = accounts_known.get()
    facts = account_for_domain(domain, known[0] if known is not None else None)
    if facts is None:
        return ProviderResult("account", "no_match", summary=f"account: none for {domain}")
    if known is not None:
        account_id = known[1].get(facts.domain) if facts.domain else None
    else:
        account_id = (
            Account.objects.filter(domain=facts.domain).values_list("id", flat=True).first()
        )
    best = {"id": account_id, "domain": facts.domain, "name": facts.name or ""}
    filled = fill_empty(lead, {"company": best["name"]}) if best["name"] else []
    data = {
        "account_id": best["id"],
        "account_name": best["name"],
        "account_domain": best["domain"],
        "matched_domain": domain,
    }
    label = best["name"] or best["domain"]
    return ProviderResult(
        "account", "done", filled, data, f"account: {domain} → {label}{_filled_note(filled)}"
    )


def provider_email(lead: Lead) -> ProviderResult:
    """Report the e-mail checks normalisation made (free-mail, disposable, invalid syntax)."""
    if not lead.email and not lead.email_domain:
        return ProviderResult("email", "skipped", summary="email: no e-mail")
    flags = set(lead.flags or [])
    data = {
        "email_domain": lead.email_domain,
        "free": FLAG_FREE_EMAIL in flags,
        "disposable": FLAG_DISPOSABLE_EMAIL in flags,
        "invalid": FLAG_INVALID_EMAIL in flags,
    }
    kinds = [name for name in ("free", "disposable", "invalid") if data[name]] or ["business"]
    return ProviderResult("email", "done", [], data, f"email: {'/'.join(kinds)}")


def provider_geo(lead: Lead) -> ProviderResult:
    """Fill an empty country from the phone number's country (normalisation made it E.164)."""
    if lead.country:
        return ProviderResult("geo", "skipped", summary=f"geo: country {lead.country} given")
    if not lead.phone:
        return ProviderResult("geo", "no_match", summary="geo: no country and no phone")
    try:
        region = phonenumbers.region_code_for_number(phonenumbers.parse(lead.phone, None))
    except Exception:  # NumberParseException or anything odd in the library: nothing found
        region = None
    # "001" is a non-geographic number (satellite, global services); "ZZ" unknown.
    if not region or len(region) != 2 or not region.isalpha() or region == "ZZ":
        return ProviderResult("geo", "no_match", summary="geo: phone has no country")
    filled = fill_empty(lead, {"country": region.upper()})
    data = {"country_from_phone": region.upper()}
    return ProviderResult("geo", "done", filled, data, f"geo: country {region} from phone")


BUILTIN_PROVIDERS: dict[str, Callable[[Lead], ProviderResult]] = {
    "account": provider_account,
    "email": provider_email,
    "geo": provider_geo,
}


def enrichment_builtin(lead: Lead) -> list[ProviderResult]:
    """Run the built-in providers named in ``ENRICHMENT_PROVIDERS``, in order, on ``lead``.

    Changes the lead in memory only (empty fields and ``lead.enrichment``); reads the database,
    never writes it. The caller saves the lead and records the ``enriched`` event. ``http`` is
    not run here: it runs on its own queue (``enrichment_http_wanted``).
    """
    results: list[ProviderResult] = []
    stored = dict(lead.enrichment) if isinstance(lead.enrichment, dict) else {}
    for name in settings.ENRICHMENT_PROVIDERS:
        provider = BUILTIN_PROVIDERS.get(name)
        if provider is None:
            if name != HTTP_PROVIDER:
                logger.warning("unknown enrichment provider %r in ENRICHMENT_PROVIDERS", name)
            continue
        result = provider(lead)
        stored[name] = result.as_json()
        results.append(result)
    lead.enrichment = stored
    return results


def enrichment_event_data(results: list[ProviderResult]) -> dict[str, Any]:
    """The ``data`` of an ``enriched`` audit event for these results."""
    return {
        "providers": {r.name: {"status": r.status, "filled": list(r.filled)} for r in results},
        "filled": sorted({name for r in results for name in r.filled}),
        "summary": "; ".join(r.summary for r in results if r.summary),
    }
