"""A question's wording → the canonical field it asks for, for the question-based form tools.

Typeform, Tally, Jotform and Webflow send each answer under the question the form's author
wrote ("What's your company called?", "Work e-mail", "Vorname"), not under a field name, so
the built-in aliases (``leads.normalize.canonical_key``) alone miss most of them. This adds a
keyword reading of short questions. It is deliberately conservative: a question that is long,
or that asks about someone else ("Their e-mail", "Your manager's name"), maps to nothing and
its answer is kept in the lead's custom fields under the question's own wording.

Shared by the ``typeform``, ``tally``, ``jotform`` and ``webflow`` kinds.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection
from typing import Any

from leads.normalize import FULL_NAME, canonical_key

# A question longer than this is a sentence about something else that happens to contain a
# keyword ("If you're OK with our city management following up..."), not a field's label.
MAX_WORDS = 12

# Questions about another person or party than the lead.
_OTHER_PARTY_RE = re.compile(
    r"\b(their|colleague|colleagues|friend|friends|referr\w*|manager|boss|assistant|"
    r"partner's|spouse|child|kids?|emergency)\b"
)

# (pattern on the folded question, target), first match wins: the more specific first
# ("company size" before "company", "Which country is your company in?" is a country).
_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), target)
    for pattern, target in (
        (r"\be ?mail\b|\bemail address\b|\be-mail\b", "email"),
        (r"\b(phone|telephone|mobile|cell ?phone|whatsapp|telefon|handy)\b", "phone"),
        (r"\b(first|given|fore) ?name\b|\bvorname\b|\bprenom\b|\bnombre\b", "first_name"),
        (r"\b(last|family|sur) ?name\b|\bsurname\b|\bnachname\b|\bapellidos?\b", "last_name"),
        (
            r"\b(how many (employees|people)|employees|company size|team size|headcount|"
            r"size of (your|the) (company|organi[sz]ation|team)|mitarbeiter)\b",
            "employees",
        ),
        (r"\b(annual revenue|revenue|turnover|umsatz)\b", "annual_revenue"),
        (r"\b(website|web site|homepage|company url|site url)\b", "website"),
        (r"\b(job title|job role|position|your role|role|title|job|designation)\b", "title"),
        (r"\b(industry|sector|branche|vertical)\b", "industry"),
        (r"\b(country|pays|pa[ií]s)\b|^land$", "country"),
        (r"\b(state|province|region|county|bundesland)\b", "region"),
        (r"\b(city|town|stadt|ort|ville|ciudad)\b", "city"),
        (r"\b(zip|postal|post ?code|postleitzahl|plz)\b", "postal_code"),
        (
            r"\b(company|organi[sz]ation|employer|business name|firm|firma|unternehmen|"
            r"empresa|entreprise|soci[eé]t[eé]|work for)\b|会社名|企業名",
            "company",
        ),
        (r"\b(full name|your name)\b|^name\b|名前|氏名", FULL_NAME),
    )
)

# What each kind of answer may be read as: a yes/no or a date is never a name or a country.
TEXT_TARGETS: frozenset[str] = frozenset(
    {
        "email",
        "first_name",
        "last_name",
        FULL_NAME,
        "phone",
        "company",
        "website",
        "domain",
        "title",
        "country",
        "region",
        "city",
        "postal_code",
        "employees",
        "annual_revenue",
        "industry",
        "lead_score",
        "utm_source",
        "utm_medium",
        "utm_campaign",
        "external_id",
    }
)
CHOICE_TARGETS: frozenset[str] = frozenset(
    {"country", "region", "employees", "annual_revenue", "industry", "title"}
)
NUMBER_TARGETS: frozenset[str] = frozenset({"employees", "annual_revenue", "lead_score"})


def fold_question(text: str) -> str:
    """Lower-case, accents dropped, punctuation as spaces: "What's your E-Mail?" →
    "what s your e mail"."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    plain = "".join(ch for ch in decomposed if not unicodedata.combining(ch))
    return " ".join(re.sub(r"[^\w@]+", " ", plain).split())


def question_target(label: Any, allowed: Collection[str] = TEXT_TARGETS) -> str | None:
    """The canonical field (or ``full_name``) a question asks for, or None.

    The built-in aliases first ("Email address", "utm_source", "Company name"), then keywords
    in a short question that is about the lead. ``allowed`` limits the answer to the fields an
    answer of its type can fill.
    """
    if not isinstance(label, str) or not label.strip():
        return None
    target = canonical_key(label)
    if target is not None:
        return target if target in allowed else None
    folded = fold_question(label)
    if not folded or len(folded.split()) > MAX_WORDS or _OTHER_PARTY_RE.search(folded):
        return None
    for pattern, rule_target in _RULES:
        if pattern.search(folded):
            return rule_target if rule_target in allowed else None
    return None


def camel_words(name: str) -> str:
    """A camel-case or snake-case field name as words: "phoneNumber" → "phone Number"."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return " ".join(spaced.replace("_", " ").replace("-", " ").split())
