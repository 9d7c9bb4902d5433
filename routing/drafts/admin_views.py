"""Admin pages of an open draft: a territories or accounts CSV imported into it (the
row-precise report of the live CSV import, nothing written unless the whole file is right); its
document edited as YAML (every problem listed with its path, nothing written unless the whole
document is right); its check (the saved test cases against its whole configuration, and recent
leads replayed against it, in words; many leads as a background job); and its rebase on the
published configuration (each conflicting row listed, nothing written then). All go through
``routing.drafts.services`` (the services the configuration API uses)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import yaml
from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from audit.config_changes import actor_of
from routing.admin_jobs import admin_job_start_draft_replay
from routing.drafts import services
from routing.drafts.checks import draft_check_report
from routing.drafts.models import ConfigDraft, ConfigDraftStatus
from routing.drafts.snapshots import config_snapshot_latest
from routing.editor.tables import COLUMNS, TableImportForm
from routing.engine import RuleErrors
from routing.models import AdminJob, AdminJobKind, RuleSet
from routing.rules_io import ConfigurationBusy, RulesFileErrors, rules_parse
from routing.tables_io import TableErrors
from routing.versions import REPLAY_DEFAULT

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

_PATH_ERRORS_SHOWN = 200


class DraftTableImportForm(TableImportForm):
    table = forms.ChoiceField(
        choices=(("territories", "Territories"), ("accounts", "Accounts")), initial="territories"
    )
    field_order = ("table", "file", "delete_missing")


class DraftDocumentForm(forms.Form):
    document = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 40, "cols": 110, "spellcheck": "false"}),
        label="Document (YAML or JSON, docs/rules-format.md)",
    )


def _open_draft(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> ConfigDraft:
    if not request.user.has_perm("routing.change_configdraft"):
        raise PermissionDenied
    draft = ConfigDraft.objects.filter(pk=pk).first()
    if draft is None:
        raise Http404("No such draft.")
    return draft


def _context(
    model_admin: ModelAdmin[Any], request: HttpRequest, draft: ConfigDraft, title: str
) -> dict[str, Any]:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": title,
        "draft": draft,
        "closed": draft.status != ConfigDraftStatus.OPEN,
        "back": reverse("admin:routing_configdraft_change", args=[draft.pk]),
    }


def draft_import_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """Upload a territories or accounts CSV into the draft: all rows right, or nothing."""
    draft = _open_draft(model_admin, request, pk)
    form = DraftTableImportForm(request.POST or None, request.FILES or None)
    errors: tuple[str, ...] = ()
    more = 0
    if request.method == "POST" and form.is_valid():
        table = form.cleaned_data["table"]
        upload = form.cleaned_data["file"]
        try:
            text = upload.read().decode("utf-8-sig")
        except UnicodeDecodeError:
            errors = ("row 1: the file is not UTF-8 text (save it as CSV UTF-8)",)
        else:
            try:
                done = services.config_draft_import_table(
                    draft_id=draft.pk,
                    table=table,
                    content=text,
                    delete_missing=form.cleaned_data["delete_missing"],
                    actor=actor_of(request),
                )
            except TableErrors as exc:
                errors, more = exc.errors, exc.more
            except RulesFileErrors as exc:
                listed = [str(error) for error in exc.errors]
                errors = tuple(listed[:_PATH_ERRORS_SHOWN])
                more = max(0, len(listed) - _PATH_ERRORS_SHOWN)
            except services.DraftRefused as exc:
                errors = (exc.message,)
            else:
                messages.success(
                    request,
                    f"Imported {done.rows} row(s) into draft {draft.pk}: {done.set} {table} set, "
                    f"{done.removed} removed. Nothing is live until the draft is published.",
                )
                return HttpResponseRedirect(
                    reverse("admin:routing_configdraft_change", args=[draft.pk])
                )
    context = {
        **_context(model_admin, request, draft, f"Import a CSV into draft {draft.pk}"),
        "form": form,
        "errors": errors,
        "more_errors": more,
        "columns": {table: ",".join(columns) for table, columns in COLUMNS.items()},
        "max_bytes": settings.ADMIN_IMPORT_MAX_BYTES,
    }
    return TemplateResponse(request, "admin/routing/configdraft/import_csv.html", context)


def document_text(document: Any) -> str:
    """A draft's document as the edit page shows it: YAML, in the document's own order."""
    return str(
        yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False)
    )


def draft_edit_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """Edit the draft's whole document as YAML (or JSON): every problem with its path, or saved."""
    draft = _open_draft(model_admin, request, pk)
    form = DraftDocumentForm(
        request.POST or None, initial={"document": document_text(draft.document)}
    )
    errors: list[str] = []
    if request.method == "POST" and form.is_valid():
        text = form.cleaned_data["document"]
        try:
            document = rules_parse(text, yaml_format=True)
            services.config_draft_replace(
                draft_id=draft.pk, document=document, actor=actor_of(request)
            )
        except RulesFileErrors as exc:
            errors = [str(error) for error in exc.errors]
        except services.DraftRefused as exc:
            errors = [exc.message]
        else:
            messages.success(request, f"Draft {draft.pk} saved.")
            return HttpResponseRedirect(
                reverse("admin:routing_configdraft_change", args=[draft.pk])
            )
    context = {
        **_context(model_admin, request, draft, f"Edit draft {draft.pk}"),
        "form": form,
        "errors": errors[:_PATH_ERRORS_SHOWN],
        "more_errors": max(0, len(errors) - _PATH_ERRORS_SHOWN),
    }
    return TemplateResponse(request, "admin/routing/configdraft/edit.html", context)


def _not_valid(exc: RulesFileErrors) -> str:
    listed = [str(error) for error in exc.errors]
    more = f" and {len(listed) - 20} more" if len(listed) > 20 else ""
    return "The draft is not valid against the tables now: " + "; ".join(listed[:20]) + more


def draft_check_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """The saved test cases against the draft's whole configuration, and the last N leads
    decided with it and with the published one, in words; writes nothing. Up to
    ``REPLAY_SYNC_MAX_LEADS`` leads run while the page loads; more start a background job."""
    draft = _open_draft(model_admin, request, pk)
    try:
        limit = int(request.POST.get("n", REPLAY_DEFAULT))
    except ValueError:
        limit = REPLAY_DEFAULT
    limit = max(1, min(limit, settings.REPLAY_MAX_LEADS))
    sync_max = settings.REPLAY_SYNC_MAX_LEADS
    check: dict[str, Any] | None = None
    error = ""
    if draft.status != ConfigDraftStatus.OPEN:
        error = f"The draft is {draft.status}: only an open draft is checked."
    elif request.method == "POST":
        replay = "replay" in request.POST
        if replay and limit > sync_max:
            job = admin_job_start_draft_replay(
                draft=draft,
                limit=limit,
                actor=request.user,  # type: ignore[arg-type]
            )
            return HttpResponseRedirect(reverse("admin:routing_adminjob_progress", args=[job.pk]))
        try:
            check = draft_check_report(draft=draft, leads=limit if replay else 0)
        except RulesFileErrors as exc:
            error = _not_valid(exc)
        except (ConfigurationBusy, RuleErrors) as exc:
            error = str(exc)
    context = {
        **_context(model_admin, request, draft, f"Check draft {draft.pk}"),
        "limit": limit,
        "max": settings.REPLAY_MAX_LEADS,
        "sync_max": sync_max,
        "check": check,
        "error": error,
        "jobs": AdminJob.objects.filter(kind=AdminJobKind.DRAFT_REPLAY, params__draft_id=draft.pk)[
            :5
        ],
    }
    return TemplateResponse(request, "admin/routing/configdraft/check.html", context)


def draft_rebase_view(model_admin: ModelAdmin[Any], request: HttpRequest, pk: int) -> HttpResponse:
    """What was published since the draft began, and its rebase: the draft's own changes
    applied to the published configuration, or every conflicting row listed and nothing
    written."""
    draft = _open_draft(model_admin, request, pk)
    conflicts: list[str] = []
    errors: list[str] = []
    if request.method == "POST" and draft.status == ConfigDraftStatus.OPEN:
        try:
            rebased = services.config_draft_rebase(draft_id=draft.pk, actor=actor_of(request))
        except services.DraftConflict as exc:
            conflicts = exc.conflicts
        except RulesFileErrors as exc:
            errors = [str(error) for error in exc.errors]
        except services.DraftRefused as exc:
            errors = [exc.message]
        else:
            messages.success(
                request,
                f"Draft {draft.pk} rebased: it now begins from configuration version "
                f"{rebased.base_number}, with its own changes applied.",
            )
            return HttpResponseRedirect(
                reverse("admin:routing_configdraft_change", args=[draft.pk])
            )
    try:
        diff = services.draft_diff(draft=draft)
    except RuleSet.DoesNotExist:
        diff = None
    latest = config_snapshot_latest()
    context = {
        **_context(model_admin, request, draft, f"Rebase draft {draft.pk}"),
        "stale": diff is not None and diff.stale,
        "published_since": diff.stale_changes if diff is not None else [],
        "latest": latest.number if latest is not None else None,
        "conflicts": conflicts,
        "errors": errors[:_PATH_ERRORS_SHOWN],
    }
    return TemplateResponse(request, "admin/routing/configdraft/rebase.html", context)
