"""Seeding the demo company: logins, sources and their tokens, routing, saved test cases.

Idempotent: the company goes in through ``rules_import`` (upserts by natural key; an unchanged
ruleset is not stored again), users and test cases are upserted by name, and the secrets the
first run made (passwords, source tokens, an API token) are kept in ``VAR_DIR/demo.json`` so
later runs print the same ones. A source whose token no longer matches that file (the file was
deleted) gets a new token.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractUser, Group
from django.db import transaction
from django.utils import timezone
from rest_framework.authtoken.models import Token

from audit.permissions import SALES_MANAGERS_GROUP, sales_managers_group_sync
from leads.models import Source
from leads.services import new_token, source_set_token
from routing.demo import company
from routing.editor.permissions import REVOPS_GROUP, revops_group_sync
from routing.models import Rep, RoutingTestCase, Team
from routing.rules_io import rules_import

STATE_FILE = "demo.json"
LOGIN_FILE = "demo-login.txt"  # what `make run` prints; one "role: user / password" per line

# username -> (role shown to people, superuser, staff, groups)
LOGINS: dict[str, tuple[str, bool, bool, tuple[str, ...]]] = {
    "admin": ("administrator", True, True, ()),
    "revops": ("RevOps (admin: routing, simulate, replay, publish)", False, True, (REVOPS_GROUP,)),
    "manager": (
        "sales manager of SDR EMEA and SDR NA (history, dashboard, reassign)",
        False,
        False,
        (SALES_MANAGERS_GROUP,),
    ),
}

AWAY_FOR = timedelta(days=5)


@dataclass
class DemoState:
    """The demo's secrets, as written to ``VAR_DIR/demo.json``."""

    passwords: dict[str, str] = field(default_factory=dict)
    source_tokens: dict[str, str] = field(default_factory=dict)
    api_token: str = ""

    @classmethod
    def load(cls, path: Path) -> DemoState:
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            return cls()
        if not isinstance(raw, dict):
            return cls()
        return cls(
            passwords=_str_map(raw.get("passwords")),
            source_tokens=_str_map(raw.get("source_tokens")),
            api_token=str(raw.get("api_token") or ""),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "passwords": self.passwords,
                    "source_tokens": self.source_tokens,
                    "api_token": self.api_token,
                },
                indent=2,
            )
        )
        tmp.chmod(0o600)
        tmp.replace(path)


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items() if isinstance(v, str) and v}


@dataclass(frozen=True)
class SeedResult:
    state: DemoState
    ruleset_version: int
    ruleset_created: bool
    test_cases: int


def demo_state_path() -> Path:
    return Path(settings.VAR_DIR) / STATE_FILE


def _source_tokens(state: DemoState, now: datetime) -> dict[str, str]:
    """A token per demo source that is valid in the database once the import has run.

    A new source takes the token from the document; an existing one whose hash does not match
    the remembered token (or with none remembered) is given a new one here.
    """
    tokens = {}
    existing = Source.objects.in_bulk(
        [company.FORM_SOURCE, company.WEBINAR_SOURCE], field_name="slug"
    )
    for slug in (company.FORM_SOURCE, company.WEBINAR_SOURCE):
        token = state.source_tokens.get(slug, "")
        source = existing.get(slug)
        if source is None:
            tokens[slug] = token or new_token()
        elif token and source.token_matches(token, now=now):
            tokens[slug] = token
        else:
            tokens[slug] = source_set_token(source=source)
    return tokens


def _away_until(now: datetime) -> dict[str, datetime | None]:
    """Keep the return dates an earlier seed set; new away reps are back in AWAY_FOR."""
    set_before = dict(
        Rep.objects.filter(email__in=company.AWAY_REPS).values_list("email", "out_of_office_until")
    )
    default = (now + AWAY_FOR).replace(minute=0, second=0, microsecond=0)
    return {email: set_before.get(email) or default for email in company.AWAY_REPS}


@transaction.atomic
def _users(state: DemoState) -> AbstractUser:
    user_model = get_user_model()
    revops_group_sync()
    sales_managers_group_sync()
    for username, (_, superuser, staff, groups) in LOGINS.items():
        user, created = user_model.objects.get_or_create(
            username=username,
            defaults={
                "email": f"{username}@{company.REP_DOMAIN}",
                "is_superuser": superuser,
                "is_staff": staff,
            },
        )
        password = state.passwords.get(username)
        if created or not password or not user.check_password(password):
            password = password or secrets.token_urlsafe(12)
            user.set_password(password)
            user.save(update_fields=["password"])
        state.passwords[username] = password
        user.groups.add(*Group.objects.filter(name__in=groups))
    admin = user_model.objects.get(username="admin")
    token, _ = Token.objects.get_or_create(user=admin)
    state.api_token = token.key
    return admin


@transaction.atomic
def _test_cases(ruleset_id: int) -> int:
    reps = dict(Rep.objects.values_list("email", "id"))
    teams = dict(Team.objects.values_list("name", "id"))
    sources = dict(Source.objects.values_list("slug", "id"))
    existing = RoutingTestCase.objects.in_bulk(
        [case[0] for case in company.TEST_CASES], field_name="name"
    )
    for name, source, lead, status, rep, team in company.TEST_CASES:
        wanted = {
            "lead": lead,
            "source_id": sources[source] if source else None,
            "expected_status": status,
            "expected_rep_id": reps[company.rep_email(rep)] if rep else None,
            "expected_team_id": teams[team] if team else None,
        }
        case = existing.get(name)
        if case is None:
            RoutingTestCase.objects.create(name=name, ruleset_id=ruleset_id, **wanted)
        elif any(getattr(case, field) != value for field, value in wanted.items()):
            # Saved only when it differs: a second seed leaves the cases (and the record of
            # the version they were written against) alone.
            for field, value in wanted.items():
                setattr(case, field, value)
            case.ruleset_id = ruleset_id
            case.save()
    return len(company.TEST_CASES)


def demo_seed(*, now: datetime | None = None) -> SeedResult:
    """Create or refresh the demo company; returns what to show the person who ran it."""
    now = now or timezone.now()
    path = demo_state_path()
    state = DemoState.load(path)
    # Users first (so the import is recorded as the admin's), then the company, then the
    # manager's teams, which exist only after the import.
    admin = _users(state)
    state.source_tokens = _source_tokens(state, now)
    document = company.demo_document(
        out_of_office_until=_away_until(now), source_tokens=state.source_tokens
    )
    result = rules_import(document, publish=True, actor=admin)
    manager = get_user_model().objects.get(username="manager")
    Team.objects.filter(name__in=company.MANAGED_TEAMS).update(manager=manager)
    cases = _test_cases(result.ruleset.pk)
    state.save(path)
    _write_login_file(state)
    return SeedResult(
        state=state,
        ruleset_version=result.ruleset.version,
        ruleset_created=result.created,
        test_cases=cases,
    )


def _write_login_file(state: DemoState) -> None:
    lines = [
        f"{username} / {state.passwords[username]}  - {role}"
        for username, (role, *_) in LOGINS.items()
    ]
    login_file = Path(settings.VAR_DIR) / LOGIN_FILE
    login_file.write_text("\n".join(lines) + "\n")
    login_file.chmod(0o600)
