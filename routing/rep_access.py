"""What a rep does without a manager: an invitation to log in, and the one-click "I'm on it" link.

**The one-click link.** Every message that tells a rep a lead is theirs (new, reassigned to
them, SLA about to breach) carries a link that records their first touch without a login. It is
signed with the secret key (Django's ``signing``, a salt of its own) and names one assignment,
its rep and a random nonce; it expires after ``TOUCH_LINK_MAX_AGE_SECONDS`` and works once: the
first use writes a ``TouchLinkUse`` row for its nonce in the same transaction as the touch, so a
second click (or a forwarded copy) is told when the link was used, and nothing is recorded
twice. The touch is the ordinary first touch (``assignment_touch``), under the lead's lock and
audited as ``touched`` by ``rep:<e-mail> (one-click link)``; if the lead was reassigned since,
the link refuses ("no longer yours"). Opening the link shows the lead and one button: the touch
is recorded by that button's POST, not by the GET, because mail security scanners open every
link in a message before the rep does.

**The invitation.** ``rep_invite`` gives a rep a login (a user named by their e-mail, with no
usable password until they choose one) and e-mails them a set-password link (Django's password
reset token: it expires after ``PASSWORD_RESET_TIMEOUT`` and stops working once used).

**Single sign-on.** ``user_sso_login`` decides whom a provider's verified e-mail signs in as
(audit.sso is the web edge): a rep's login, made at the first sign-in for an active rep, or an
existing login for anyone else; never a new login for a manager.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from audit.config_changes import config_change_record
from audit.permissions import user_roles_set
from routing.models import Assignment, Rep, TouchLinkUse
from routing.services import LeadActionError, assignment_touch
from routing.touch_links import TouchLinkError, links_base_url, touch_link_claims


@dataclass(frozen=True)
class TouchLinkView:
    """What the link's page shows: the lead in a few words, and whether the button can work."""

    assignment: Assignment
    state: str  # "ready", "touched" (already, by any means), "used" (this link), "reassigned"
    used_at: datetime | None = None

    @property
    def who(self) -> str:
        lead = self.assignment.lead
        return lead.full_name or lead.email or lead.phone or "this lead"


def _view(assignment: Assignment, nonce: str) -> TouchLinkView:
    use = TouchLinkUse.objects.filter(nonce=nonce).first()
    if use is not None:
        return TouchLinkView(assignment, "used", use.used_at)
    current = Assignment.objects.filter(lead_id=assignment.lead_id, active=True).first()
    if current is None or current.pk != assignment.pk:
        return TouchLinkView(assignment, "reassigned")
    if assignment.touched_at is not None:
        return TouchLinkView(assignment, "touched", assignment.touched_at)
    return TouchLinkView(assignment, "ready")


def _assignment(assignment_id: int, rep_id: int) -> Assignment:
    assignment = (
        Assignment.objects.select_related("lead", "rep")
        .filter(pk=assignment_id, rep_id=rep_id)
        .first()
    )
    if assignment is None:
        raise TouchLinkError("invalid", "This link is not valid.", 404)
    return assignment


def touch_link_read(*, token: str) -> TouchLinkView:
    """The link's lead and state, changing nothing (the page a GET shows)."""
    assignment_id, rep_id, nonce = touch_link_claims(token)
    return _view(_assignment(assignment_id, rep_id), nonce)


def touch_link_use(*, token: str, now: datetime | None = None) -> TouchLinkView:
    """Record the first touch the link stands for, once; the state afterwards.

    All or nothing: the use is written in the touch's transaction, so a refused touch (the lead
    reassigned since) leaves the link usable for nothing else but also not marked used, and two
    clicks at once record one touch (the nonce is unique: the second waits for the first's
    commit, then finds its row).
    """
    assignment_id, rep_id, nonce = touch_link_claims(token)
    assignment = _assignment(assignment_id, rep_id)
    now = now or timezone.now()
    try:
        with transaction.atomic():
            TouchLinkUse.objects.create(nonce=nonce, assignment=assignment, used_at=now)
            touched = assignment_touch(
                lead_id=assignment.lead_id,
                actor=f"rep:{assignment.rep.email} (one-click link)",
                assignment_id=assignment.pk,
                now=now,
            )
    except IntegrityError:
        return _view(assignment, nonce)  # used meanwhile: its row tells when
    except LeadActionError as exc:
        if exc.code == "reassigned":
            return TouchLinkView(assignment, "reassigned")
        raise TouchLinkError(exc.code, exc.message, exc.status) from exc
    assignment.touched_at = touched.touched_at
    if touched.touched_at != now:
        # Recorded before this click (the rep's page, the CRM, a manager): nothing new.
        return TouchLinkView(assignment, "touched", touched.touched_at)
    return TouchLinkView(assignment, "done", touched.touched_at)


# --- Invitations -------------------------------------------------------------------------------


class InviteError(Exception):
    """An invitation that cannot be sent, in a sentence for RevOps."""


def _login_for(rep: Rep) -> tuple[object, bool]:
    """The rep's user, creating one (named by their e-mail, no usable password) if needed."""
    if rep.user_id is not None:
        return rep.user, False
    users = get_user_model()
    username = rep.email.strip().lower()
    existing = users.objects.filter(username__iexact=username).first()
    if existing is not None:
        if Rep.objects.filter(user=existing).exists():
            raise InviteError(
                f"The login {existing.get_username()} already belongs to another rep."
            )
        return existing, False
    user = users.objects.create_user(username=username, email=rep.email)
    user.set_unusable_password()
    user.save(update_fields=["password"])
    return user, True


def set_password_url(user: object) -> str:
    """The absolute link to choose a password (Django's password reset token for ``user``)."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))  # type: ignore[attr-defined]
    token = default_token_generator.make_token(user)  # type: ignore[arg-type]
    return links_base_url() + reverse("set-password", kwargs={"uidb64": uid, "token": token})


def rep_invite(*, rep_id: int, actor: str) -> str:
    """Give the rep a login if they have none and e-mail them a set-password link; the link.

    Audited as a ``config_changed`` event on the rep (action ``invited``). The e-mail goes out
    after the login is committed; if the mail server refuses, ``InviteError`` says so and the
    login stays (inviting again sends a new link).
    """
    with transaction.atomic():
        rep = Rep.objects.select_for_update().get(pk=rep_id)
        if not rep.active:
            raise InviteError(f"{rep.email} is inactive: activate the rep before inviting them.")
        user, created = _login_for(rep)
        if rep.user_id != user.pk:  # type: ignore[attr-defined]
            rep.user = user  # type: ignore[assignment]
            rep.save(update_fields=["user", "updated_at"])
        link = set_password_url(user)
        config_change_record(
            actor=actor,
            obj=rep,
            action="invited",
            extra={"login": user.get_username(), "login_created": created},  # type: ignore[attr-defined]
        )
    hours = settings.PASSWORD_RESET_TIMEOUT // 3600
    text = (
        f"Hello {rep.name},\n\n"
        "You can now log in to LeadRouter to see the leads assigned to you, mark the ones "
        "you are on, and plan your time off.\n\n"
        f"Choose your password here (the link works once, for {hours} hours):\n{link}\n\n"
        f"Your login: {user.get_username()}\n"  # type: ignore[attr-defined]
    )
    try:
        send_mail(
            "Your LeadRouter login",
            text,
            settings.DEFAULT_FROM_EMAIL,
            [rep.email],
            fail_silently=False,
        )
    except Exception as exc:  # SMTP refusal, timeout, unreachable server
        raise InviteError(
            f"The login of {rep.email} is ready, but the invitation e-mail failed ({exc}); "
            "invite again to send a new link."
        ) from exc
    return link


# --- Single sign-on ---------------------------------------------------------------------------


class LoginRefused(Exception):
    """A sign-in the provider vouched for that LeadRouter still refuses, in a sentence."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _users_named(address: str) -> list[Any]:
    users = get_user_model()
    found = users.objects.filter(Q(email__iexact=address) | Q(username__iexact=address))
    return list(found.order_by("pk")[:2])


def _existing_login(address: str) -> Any:
    candidates = _users_named(address)
    if not candidates:
        raise LoginRefused(
            f"{address} has no LeadRouter login and is not a rep's e-mail. Ask RevOps to add you."
        )
    if len(candidates) > 1:
        raise LoginRefused(f"More than one login has the e-mail {address}. Ask RevOps to fix it.")
    return candidates[0]


def user_sso_login(
    *,
    email: str,
    allowed_domains: list[str],
    actor: str,
    roles: Collection[str] | None = None,
    managed_roles: Collection[str] = (),
) -> Any:
    """The user a provider's verified e-mail signs in as; an active rep's login is made if needed.

    The e-mail is matched, ignoring case, to a rep first: the rep's login if they have one, else
    (an active rep only, as for ``rep_invite``) the existing login of that name or e-mail that
    belongs to no other rep, else a new one named by the e-mail with no usable password; linking
    it is audited as ``config_changed`` on the rep (action ``sso_linked``). Anyone else must
    already have a login with that e-mail or name: no login is made for them, so managers are
    only ever matched, unless the provider's groups give them a role.

    ``roles`` (None: single sign-on maps no groups) are the roles the provider's groups give,
    among ``managed_roles`` (every role the mapping names): the user gets exactly those (added,
    and removed once the provider no longer gives them; ``audit.permissions.user_roles_set``),
    and someone with no login yet whom they give any role gets one, named by the e-mail with no
    usable password. All in one transaction. ``LoginRefused`` says why not.
    """
    address = email.strip().lower()
    if "@" not in address:
        raise LoginRefused("The provider sent no usable e-mail address.")
    domain = address.rsplit("@", 1)[1]
    if allowed_domains and domain not in allowed_domains:
        raise LoginRefused(f"E-mail addresses at {domain} may not sign in here.")
    created = False
    with transaction.atomic():
        rep = Rep.objects.select_for_update().filter(email__iexact=address).first()
        if rep is not None and rep.user_id is not None:
            user: Any = rep.user
        elif rep is not None and rep.active:
            candidates = _users_named(address)
            if len(candidates) > 1:
                raise LoginRefused(
                    f"More than one login has the e-mail {address}. Ask RevOps to fix it."
                )
            created = not candidates
            if created:
                user = get_user_model().objects.create_user(username=address, email=rep.email)
                user.set_unusable_password()
                user.save(update_fields=["password"])
            else:
                user = candidates[0]
                if Rep.objects.filter(user=user).exists():
                    raise LoginRefused(
                        f"The login {user.get_username()} already belongs to another rep."
                    )
            rep.user = user
            rep.save(update_fields=["user", "updated_at"])
            config_change_record(
                actor=actor,
                obj=rep,
                action="sso_linked",
                extra={"login": user.get_username(), "login_created": created},
            )
        elif roles and not _users_named(address):  # given a role by the provider's groups
            try:
                with transaction.atomic():  # a second sign-in at once may make it first
                    user = get_user_model().objects.create_user(username=address, email=address)
                    user.set_unusable_password()
                    user.save(update_fields=["password"])
                created = True
            except IntegrityError:
                user = _existing_login(address)
        else:  # not a rep, or an inactive one: existing logins only
            user = _existing_login(address)
        if roles is not None and user.is_active:
            user_roles_set(
                user=user,
                roles=roles,
                managed=managed_roles,
                actor=actor,
                login_created=created,
            )
    if not user.is_active:
        raise LoginRefused(f"The login {user.get_username()} is disabled.")
    return user


def rep_of_user(user: object) -> Rep | None:
    """The rep whose login this is, or None."""
    if not getattr(user, "is_authenticated", False):
        return None
    return Rep.objects.filter(user_id=user.pk).first()  # type: ignore[attr-defined]
