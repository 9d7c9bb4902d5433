"""Admin mixin: a save of a table that routes is a configuration version (``routing.drafts.live``).

The admin's forms stay live (a team, a territory, a rep's caps change on the next lead) but are
never unrecorded: each POST that can change the routed configuration (a change or add form
with its inlines, a delete, a list's inline edits or bulk delete) runs in its own transaction
under the configuration lock, and when the routed configuration differs afterwards it is
stored as the next numbered version, audited like a draft's publish, which rollback covers and
each lead's trace names. Another publish, import or replay still holding the lock after
``LOCK_WAIT_SECONDS`` is a message and nothing is saved, as is a change after which the
published rules no longer compile. A rep's live state (active, out of office, absences) is no
version: such a save records none.

Like a publish, a save that changes the routed configuration runs the saved test cases against
the configuration it leaves; when one fails, nothing is saved and the message names the failing
cases, unless the form's "Save even though saved test cases fail" box (on a delete page and a
list's bulk delete confirmation: "Delete even though …") was ticked (POST
``_force_failing_test_cases``): then the version and its ``published`` event name who forced it
and which cases failed. (Saves of the test cases themselves are not gated.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse

from audit.config_changes import actor_of
from routing.configuration import LOCK_WAIT_SECONDS
from routing.drafts.live import LiveChangeRefused, config_live_change
from routing.rules_io import ConfigurationBusy
from routing.versions import TestCasesFailing

# Bulk actions of a list that change a table (the others, such as a rep's out of office, change
# live state only and take no configuration lock).
VERSIONED_ACTIONS = frozenset({"delete_selected"})
FORCE_FIELD = "_force_failing_test_cases"  # the form's box: save although saved cases fail


class VersionedConfigAdmin:
    """ModelAdmin mixin (before ``AuditedConfigAdmin``): see the module docstring."""

    # Saves that write rows each lead's routing locks (a team's, a rep's) hold the decide lock
    # from the start (``routing.configuration.plan_touches_claimed_rows``); others only for the
    # final swap.
    versioned_locks_claimed_rows = False
    # Whether a save runs the saved test cases first (refused when one fails, unless forced).
    versioned_test_cases = True

    def versioned(
        self, request: HttpRequest, view: Callable[[], HttpResponse], *, deleting: bool = False
    ) -> HttpResponse:
        """Run ``view`` (a POST that may change the routed configuration) as a live change;
        ``deleting``: it is a delete page's (or bulk delete's), for the refusal's words."""
        if request.method != "POST" or request.__dict__.get("_config_versioned"):
            return view()
        request.__dict__["_config_versioned"] = True
        name = self.model._meta.verbose_name  # type: ignore[attr-defined]
        try:
            with config_live_change(
                actor=actor_of(request),
                user=request.user,
                what=f"the admin ({name})",
                wait_seconds=LOCK_WAIT_SECONDS,
                locks_claimed_rows=self.versioned_locks_claimed_rows,
                test_cases=self.versioned_test_cases,
                force=bool(request.POST.get(FORCE_FIELD)),
            ) as stored:
                response = view()
        except (ConfigurationBusy, LiveChangeRefused) as exc:
            self.message_user(request, str(exc), messages.ERROR)  # type: ignore[attr-defined]
            return HttpResponseRedirect(request.get_full_path())
        except TestCasesFailing as exc:
            failing = [result for result in exc.results if not result.passed]
            self.message_user(  # type: ignore[attr-defined]
                request,
                f"Not saved: after this change {len(failing)} saved test case(s) fail: "
                + "; ".join(
                    f"{result.case.name} ({', '.join(result.problems)})" for result in failing
                )
                + ". Fix the change or the cases; or "
                + (
                    'tick "Delete even though saved test cases fail" on the delete page and '
                    "delete again"
                    if deleting
                    else 'tick "Save even though saved test cases fail" on the change form and '
                    "save again"
                )
                + ", or publish it through a configuration draft with force (either is recorded "
                "with your name and the cases).",
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())
        if stored:
            forced = stored[0].failing_test_cases
            self.message_user(  # type: ignore[attr-defined]
                request,
                f"Recorded as configuration version {stored[0].number} (it can be rolled back "
                "under Configuration versions)."
                + (f" Saved although these test cases fail: {', '.join(forced)}." * bool(forced)),
                messages.WARNING if forced else messages.INFO,
            )
        return response

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        parent = super()
        # The submit row's "Save even though saved test cases fail" box
        # (templates/admin/routing/submit_line.html).
        extra_context = {**(extra_context or {}), "versioned_test_cases": self.versioned_test_cases}
        return self.versioned(
            request,
            lambda: parent.changeform_view(request, object_id, form_url, extra_context),  # type: ignore[attr-defined]
        )

    def delete_view(
        self, request: HttpRequest, object_id: str, extra_context: Any = None
    ) -> HttpResponse:
        parent = super()
        # The delete page's "Delete even though saved test cases fail" box
        # (templates/admin/routing/delete_confirmation.html).
        extra_context = {**(extra_context or {}), "versioned_test_cases": self.versioned_test_cases}
        return self.versioned(
            request,
            lambda: parent.delete_view(request, object_id, extra_context),  # type: ignore[attr-defined]
            deleting=True,
        )

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        parent = super()

        def view() -> HttpResponse:
            response: HttpResponse = parent.changelist_view(request, extra_context)  # type: ignore[attr-defined]
            if isinstance(response, TemplateResponse) and response.context_data is not None:
                # The bulk delete confirmation's box
                # (templates/admin/routing/delete_selected_confirmation.html).
                response.context_data["versioned_test_cases"] = self.versioned_test_cases
            return response

        action = request.POST.get("action") if request.method == "POST" else None
        if request.method == "POST" and (action in VERSIONED_ACTIONS or "_save" in request.POST):
            return self.versioned(request, view, deleting=action == "delete_selected")
        return view()
