"""Admin for drafts of the whole configuration and its versions: begin a draft, see what it
changes in words, change it (its document edited as YAML, a territories or accounts CSV
imported into it), check it (test cases, replay) and rebase it (``routing.drafts.admin_views``),
publish it (or discard it); see each version's changes, roll back to one. Every action goes
through ``routing.drafts.services``; a publish and a rollback are queued for a worker
(``routing.drafts.jobs``) and open the job's progress page, which ends on the version published
or on why it was refused."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from audit.config_changes import actor_of
from routing.drafts import services
from routing.drafts.admin_views import (
    draft_check_view,
    draft_edit_view,
    draft_import_view,
    draft_rebase_view,
)
from routing.drafts.diff import RowChange, configuration_diff
from routing.drafts.jobs import config_job_start_publish, config_job_start_rollback
from routing.drafts.models import ConfigDraft, ConfigSnapshot
from routing.models import RuleSet
from routing.selectors import ruleset_published

_SHOWN = 200


def _words(changes: list[RowChange], every: str | None = None) -> Any:
    """The changes in words, the first ``_SHOWN`` on the page; past that a link to ``every``
    (all of them as text, ``_all_changes``), so that every changed row can be read."""
    if not changes:
        return "No change."
    items = format_html_join("", "<li>{}</li>", ((c.words,) for c in changes[:_SHOWN]))
    if len(changes) <= _SHOWN:
        return format_html("<ul>{}</ul>", items)
    more = len(changes) - _SHOWN
    if every is None:
        return format_html("<ul>{}</ul> … and {} more", items, more)
    return format_html(
        '<ul>{}</ul> … and {} more: <a href="{}" class="all-changes">all {} changes, as text</a>',
        items,
        more,
        every,
        len(changes),
    )


def _all_changes(title: str, *sections: tuple[str, list[RowChange]]) -> HttpResponse:
    """Every change in words, one a line, under a heading a section: ``changes.txt``."""
    lines = [title, ""]
    for heading, changes in sections:
        lines += [f"{heading} ({len(changes)})", *(f"- {c.words}" for c in changes), ""]
    return HttpResponse("\n".join(lines), content_type="text/plain; charset=utf-8")


def _document(document: Any) -> Any:
    return format_html(
        "<pre style='max-height:30em;overflow:auto'>{}</pre>",
        json.dumps(document, indent=2, ensure_ascii=False),
    )


class ConfigDraftForm(forms.ModelForm):
    class Meta:
        model = ConfigDraft
        fields = ("note",)

    def clean(self) -> dict[str, Any]:
        if ruleset_published() is None:
            raise forms.ValidationError(
                "No configuration is published yet: import one first (routing_import --publish)."
            )
        return super().clean() or {}


@admin.register(ConfigDraft)
class ConfigDraftAdmin(admin.ModelAdmin):
    form = ConfigDraftForm
    list_display = (
        "id",
        "status",
        "note",
        "base_number",
        "published_as",
        "created_by",
        "updated_at",
    )
    list_filter = ("status",)
    search_fields = ("note", "created_by")
    list_select_related = ("published_as",)
    actions = ("publish", "publish_forced", "discard")
    fields = ("note",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[ConfigDraft]:
        return super().get_queryset(request).defer("published_as__document")

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("note",)
        return (
            "change_it",
            "status",
            "note",
            "base_number",
            "published_as",
            "created_by",
            "created_at",
            "updated_at",
            "changes_in_words",
            "document_shown",
        )

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return () if obj is None else self.get_fields(request, obj)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # discard instead: the audit trail keeps naming the draft

    def has_publish_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("routing.add_configsnapshot"))

    def get_urls(self) -> list[URLPattern]:
        def import_csv(request: HttpRequest, pk: int) -> HttpResponse:
            return draft_import_view(self, request, pk)

        def edit(request: HttpRequest, pk: int) -> HttpResponse:
            return draft_edit_view(self, request, pk)

        def check(request: HttpRequest, pk: int) -> HttpResponse:
            return draft_check_view(self, request, pk)

        def rebase(request: HttpRequest, pk: int) -> HttpResponse:
            return draft_rebase_view(self, request, pk)

        def changes(request: HttpRequest, pk: int) -> HttpResponse:
            draft = ConfigDraft.objects.filter(pk=pk).first()
            if draft is None or not self.has_view_permission(request, draft):
                raise PermissionDenied
            try:
                diff = services.draft_diff(draft=draft)
            except RuleSet.DoesNotExist:
                return _all_changes(f"Draft {draft.pk}: no configuration is published.")
            sections = [("What publishing it would change", diff.changes)]
            if diff.stale:
                sections.insert(0, ("Published since it began", diff.stale_changes))
            return _all_changes(f"Draft {draft.pk} ({draft.status})", *sections)

        return [
            path(
                "<int:pk>/changes.txt",
                self.admin_site.admin_view(changes),
                name="routing_configdraft_changes",
            ),
            path(
                "<int:pk>/import/",
                self.admin_site.admin_view(import_csv),
                name="routing_configdraft_import",
            ),
            path(
                "<int:pk>/edit/", self.admin_site.admin_view(edit), name="routing_configdraft_edit"
            ),
            path(
                "<int:pk>/check/",
                self.admin_site.admin_view(check),
                name="routing_configdraft_check",
            ),
            path(
                "<int:pk>/rebase/",
                self.admin_site.admin_view(rebase),
                name="routing_configdraft_rebase",
            ),
            *super().get_urls(),
        ]

    @admin.display(description="Change it")
    def change_it(self, obj: ConfigDraft) -> Any:
        if obj.status != "open":
            return "—"
        return format_html(
            '<a href="{}" id="draft-edit">Edit the document</a> · '
            '<a href="{}" id="draft-import">Import a territories or accounts CSV</a> · '
            '<a href="{}" id="draft-check">Run the test cases, replay leads</a> · '
            '<a href="{}" id="draft-rebase">Rebase on the published configuration</a>',
            reverse("admin:routing_configdraft_edit", args=[obj.pk]),
            reverse("admin:routing_configdraft_import", args=[obj.pk]),
            reverse("admin:routing_configdraft_check", args=[obj.pk]),
            reverse("admin:routing_configdraft_rebase", args=[obj.pk]),
        )

    @admin.display(description="What publishing it would change")
    def changes_in_words(self, obj: ConfigDraft) -> Any:
        if obj.status != "open":
            return "—"
        try:
            diff = services.draft_diff(draft=obj)
        except RuleSet.DoesNotExist:
            return "No configuration is published."
        every = reverse("admin:routing_configdraft_changes", args=[obj.pk])
        if not diff.stale:
            return _words(diff.changes, every)
        return format_html(
            "<p><strong>Stale: published since it began (publishing is refused):</strong></p>"
            "{}<p>Its changes against the published configuration:</p>{}",
            _words(diff.stale_changes, every),
            _words(diff.changes, every),
        )

    @admin.display(description="Document")
    def document_shown(self, obj: ConfigDraft) -> Any:
        return _document(obj.document)

    def save_model(self, request: HttpRequest, obj: ConfigDraft, form: Any, change: bool) -> None:
        created = services.config_draft_create(
            actor=actor_of(request), note=form.cleaned_data.get("note", "")
        )
        obj.pk = created.pk
        obj.__dict__.update(
            {f.attname: getattr(created, f.attname) for f in obj._meta.concrete_fields}
        )

    def _publish(
        self, request: HttpRequest, queryset: QuerySet[ConfigDraft], force: bool
    ) -> HttpResponse | None:
        """Queue the publish of one draft (a worker runs it) and open its progress page."""
        ids = list(queryset.values_list("pk", flat=True))
        if len(ids) != 1:
            self.message_user(request, "Choose one draft to publish.", messages.ERROR)
            return None
        try:
            job = config_job_start_publish(
                draft_id=ids[0], actor=actor_of(request), user=request.user, force=force
            )
        except services.DraftRefused as exc:
            self.message_user(
                request, f"Draft {ids[0]} not published: {exc.message}", messages.ERROR
            )
            return None
        return HttpResponseRedirect(reverse("admin:routing_adminjob_progress", args=[job.pk]))

    @admin.action(description="Publish (the saved test cases must pass)", permissions=["publish"])
    def publish(self, request: HttpRequest, queryset: QuerySet[ConfigDraft]) -> Any:
        return self._publish(request, queryset, force=False)

    @admin.action(description="Publish over failing test cases (audited)", permissions=["publish"])
    def publish_forced(self, request: HttpRequest, queryset: QuerySet[ConfigDraft]) -> Any:
        return self._publish(request, queryset, force=True)

    @admin.action(description="Discard", permissions=["change"])
    def discard(self, request: HttpRequest, queryset: QuerySet[ConfigDraft]) -> None:
        for draft in queryset:
            try:
                services.config_draft_discard(draft_id=draft.pk, actor=actor_of(request))
            except services.DraftRefused as exc:
                self.message_user(request, f"Draft {draft.pk}: {exc.message}", messages.ERROR)


@admin.register(ConfigSnapshot)
class ConfigSnapshotAdmin(admin.ModelAdmin):
    list_display = (
        "number",
        "kind",
        "ruleset_version",
        "published_at",
        "published_by",
        "note",
        "rolled_back_to",
    )
    list_filter = ("kind",)
    search_fields = ("note", "published_by")
    actions = ("roll_back",)
    fields = (
        "number",
        "kind",
        "ruleset_version",
        "published_at",
        "published_by",
        "note",
        "rolled_back_to",
        "failing_test_cases",
        "changes_in_words",
        "document_shown",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[ConfigSnapshot]:
        queryset = super().get_queryset(request)
        return (
            queryset
            if request.resolver_match and "object_id" in (request.resolver_match.kwargs)
            else queryset.defer("document")
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # a version is immutable

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_publish_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("routing.add_configsnapshot"))

    @admin.display(description="Changes from the version before")
    def changes_in_words(self, obj: ConfigSnapshot) -> Any:
        before = ConfigSnapshot.objects.filter(number__lt=obj.number).order_by("-number").first()
        if before is None:
            return "The first version."
        every = reverse("admin:routing_configsnapshot_changes", args=[obj.pk])
        return _words(configuration_diff(before=before.document, after=obj.document), every)

    def get_urls(self) -> list[URLPattern]:
        def changes(request: HttpRequest, pk: int) -> HttpResponse:
            snapshot = ConfigSnapshot.objects.filter(pk=pk).first()
            if snapshot is None or not self.has_view_permission(request, snapshot):
                raise PermissionDenied
            before = (
                ConfigSnapshot.objects.filter(number__lt=snapshot.number)
                .order_by("-number")
                .first()
            )
            title = f"Configuration version {snapshot.number}"
            if before is None:
                return _all_changes(f"{title}: the first version.")
            return _all_changes(
                title,
                (
                    f"Changes from version {before.number}",
                    configuration_diff(before=before.document, after=snapshot.document),
                ),
            )

        return [
            path(
                "<int:pk>/changes.txt",
                self.admin_site.admin_view(changes),
                name="routing_configsnapshot_changes",
            ),
            *super().get_urls(),
        ]

    @admin.display(description="Document")
    def document_shown(self, obj: ConfigSnapshot) -> Any:
        return _document(obj.document)

    @admin.action(
        description="Roll back to this version (as a new version)", permissions=["publish"]
    )
    def roll_back(self, request: HttpRequest, queryset: QuerySet[ConfigSnapshot]) -> Any:
        """Queue the rollback (a worker runs it) and open its progress page."""
        numbers = list(queryset.values_list("number", flat=True))
        if len(numbers) != 1:
            self.message_user(request, "Choose one version to roll back to.", messages.ERROR)
            return None
        try:
            job = config_job_start_rollback(
                number=numbers[0], actor=actor_of(request), user=request.user
            )
        except services.DraftRefused as exc:
            self.message_user(request, f"Not rolled back: {exc.message}", messages.ERROR)
            return None
        return HttpResponseRedirect(reverse("admin:routing_adminjob_progress", args=[job.pk]))
