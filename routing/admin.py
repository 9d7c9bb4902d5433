"""Admin for the routing configuration: RevOps' no-code rule editor.

Declarative; changes of state go through services (``routing.versions``, ``routing.rules_io``),
extra pages live in ``routing.editor.views`` and are routed by ``get_urls``. Only draft rulesets
and their rules can be edited; published and archived versions are shown read-only and say so.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Count, F, QuerySet
from django.forms import BaseInlineFormSet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from audit.config_changes import (
    AuditedConfigAdmin,
    actor_of,
    config_changes_record,
    values_of,
)
from config.json_input import BoundedJsonAdmin
from routing.decisions import sla_clocks_refresh
from routing.drafts.live import LiveChangeRefused
from routing.editor import jobs, tables, views
from routing.editor.forms import OutOfOfficeForm, RoutingTestCaseForm, RuleForm
from routing.editor.versioned import VersionedConfigAdmin
from routing.engine import MAX_TEAM_WEIGHT, RuleErrors
from routing.engine.describe import describe_action, describe_condition
from routing.models import (
    Account,
    AdminJob,
    QueueHeartbeat,
    Rep,
    RoutingTestCase,
    Rule,
    RuleSet,
    RuleSetStatus,
    Team,
    TeamMembership,
    Territory,
    ValueList,
    VersionReadOnly,
)
from routing.rep_access import InviteError, rep_invite
from routing.rules_io import AlreadyPublished, ConfigurationBusy, ruleset_add_draft
from routing.selectors import names_in_use
from routing.timeoff.admin import RepAbsenceInline
from routing.timeoff.services import (
    AwayReroute,
    rep_lock_for_absences,
    reps_available,
    reps_away_reroute,
)
from routing.versions import (
    TestCasesFailing,
    reps_deactivate,
    reps_set_out_of_office,
    ruleset_publish_checked,
    team_memberships_renumber,
    team_next_up,
)


class RefuseDeletingWhatRulesUse:
    """Admin mixin: no deleting a team, rep or list that a draft or published rule names."""

    in_use_kind = ""

    def _users(self, obj: Any) -> list[str]:
        key = obj.email.strip().lower() if self.in_use_kind == "reps" else obj.name
        return list(getattr(names_in_use(), self.in_use_kind).get(key, []))

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        allowed: bool = super().has_delete_permission(request, obj)  # type: ignore[misc]
        return allowed and (obj is None or not self._users(obj))


@admin.register(Rep)
class RepAdmin(
    VersionedConfigAdmin,
    AuditedConfigAdmin,
    BoundedJsonAdmin,
    RefuseDeletingWhatRulesUse,
    admin.ModelAdmin,
):
    in_use_kind = "reps"
    versioned_locks_claimed_rows = True
    list_display = (
        "email",
        "name",
        "active",
        "out_of_office_until",
        "timezone",
        "max_open",
        "max_per_day",
        "last_assigned_at",
    )
    list_filter = ("active", "timezone")
    search_fields = ("email", "name")
    autocomplete_fields = ("user",)
    readonly_fields = ("last_assigned_at", "created_at", "updated_at")
    actions = ("set_out_of_office", "deactivate", "reroute_open_leads", "invite_to_log_in")
    inlines = (RepAbsenceInline,)

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        if request.method != "POST" or object_id is None or not object_id.isdigit():
            return super().changeform_view(request, object_id, form_url, extra_context)
        # The configuration lock first (a version of the rep's design), then the rep's row.
        return self.versioned(
            request, lambda: self._rep_changeform(request, object_id, form_url, extra_context)
        )

    def _rep_changeform(
        self, request: HttpRequest, object_id: str, form_url: str, extra_context: Any
    ) -> HttpResponse:
        with transaction.atomic():
            # The rep's row locked before the form checks its absences for overlaps (another
            # save of this rep's absences waits), as rep_absence_save does.
            rep_lock_for_absences(rep_id=int(object_id))
            # Available before the save (the form, its absences): re-route if no longer after.
            request.__dict__["_rep_was_available"] = bool(reps_available(rep_ids=[int(object_id)]))
            return super().changeform_view(request, object_id, form_url, extra_context)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        super().save_related(request, form, formsets, change)
        rep = form.instance
        # Absences (or working hours) changed: the running SLA clocks of the rep's leads.
        sla_clocks_refresh(rep_ids=[rep.pk])
        if request.__dict__.get("_rep_was_available") and not reps_available(rep_ids=[rep.pk]):
            self._report(request, rep.name, self._away(request, [rep], "became unavailable"))

    @admin.action(description="Set out of office until ...", permissions=["change"])
    def set_out_of_office(
        self, request: HttpRequest, queryset: QuerySet[Rep]
    ) -> TemplateResponse | None:
        form = OutOfOfficeForm(request.POST if "apply" in request.POST else None)
        if form.is_valid():
            reps = list(queryset)
            until = form.cleaned_data["until"]
            before = {rep.pk: values_of(rep) for rep in reps}
            was = reps_available(rep_ids=before)
            count = reps_set_out_of_office(reps=reps, until=until)
            config_changes_record(
                actor=actor_of(request), objects=reps, action="set_out_of_office", before=before
            )
            self.message_user(request, f"{count} rep(s) out of office.", messages.SUCCESS)
            lost = [rep for rep in reps if rep.pk in was - reps_available(rep_ids=was)]
            if lost:
                why = f"out of office until {until:%Y-%m-%d %H:%M}"
                self._report(
                    request, ", ".join(r.name for r in lost), self._away(request, lost, why)
                )
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Set out of office",
            "form": form,
            "reps": queryset,
            "action": "set_out_of_office",
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/routing/rep/out_of_office.html", context)

    @admin.action(description="Deactivate (no new leads)", permissions=["change"])
    def deactivate(self, request: HttpRequest, queryset: QuerySet[Rep]) -> None:
        reps = list(queryset)
        before = {rep.pk: values_of(rep) for rep in reps}
        was = reps_available(rep_ids=before)
        count = reps_deactivate(reps=reps)
        config_changes_record(
            actor=actor_of(request), objects=reps, action="deactivate", before=before
        )
        if settings.REROUTE_OPEN_LEADS_ON_ABSENCE:
            lost = [rep for rep in reps if rep.pk in was]
            if lost:
                names = ", ".join(rep.name for rep in lost)
                self._report(request, names, self._away(request, lost, "deactivated"))
            return
        self.message_user(
            request,
            f"{count} rep(s) deactivated: they get no new leads. Their open leads stay theirs "
            'until reassigned (or use "Re-route their open leads").',
            messages.SUCCESS,
        )

    @admin.action(
        description="Invite to log in (e-mail a set-password link)", permissions=["change"]
    )
    def invite_to_log_in(self, request: HttpRequest, queryset: QuerySet[Rep]) -> None:
        sent = []
        for rep in queryset:
            try:
                rep_invite(rep_id=rep.pk, actor=actor_of(request))
            except InviteError as exc:
                self.message_user(request, str(exc), messages.ERROR)
            else:
                sent.append(rep.email)
        if sent:
            self.message_user(
                request,
                f"Invitation sent to {', '.join(sent)}: they choose a password and see their "
                "own leads at /me/.",
                messages.SUCCESS,
            )

    @admin.action(description="Re-route their open leads (untouched)", permissions=["change"])
    def reroute_open_leads(self, request: HttpRequest, queryset: QuerySet[Rep]) -> None:
        self._reroute(request, list(queryset), "re-routed by hand")

    def _reroute(self, request: HttpRequest, reps: list[Rep], why: str) -> None:
        from routing.services import rep_reroute_open_leads

        actor = f"user:{request.user.get_username()}"
        for rep in reps:
            report = rep_reroute_open_leads(rep_id=rep.pk, actor=actor, reason=f"{rep.name} {why}")
            self._report(request, rep.name, AwayReroute(moved=report.moved, kept=report.kept))

    def _away(self, request: HttpRequest, reps: list[Rep], why: str) -> AwayReroute:
        """Re-route the untouched leads of reps who became unavailable (now or as a job)."""
        names = ", ".join(rep.name for rep in reps)
        return reps_away_reroute(
            rep_ids=[rep.pk for rep in reps],
            actor=actor_of(request),
            reason=f"{names} {why}",
            requested_by=request.user if request.user.is_authenticated else None,
        )

    def _report(self, request: HttpRequest, names: str, report: AwayReroute) -> None:
        if report.disabled:
            return
        if report.job is not None:
            url = reverse("admin:routing_adminjob_progress", args=[report.job.pk])
            self.message_user(
                request,
                format_html(
                    '{}: {} open lead(s) are being routed again: <a href="{}">progress</a>.',
                    names,
                    report.job.progress_total,
                    url,
                ),
                messages.SUCCESS,
            )
            return
        self.message_user(
            request,
            f"{names}: {report.moved} open lead(s) routed to someone else"
            + (f", {report.kept} kept (no other eligible owner)" if report.kept else "")
            + ".",
            messages.SUCCESS if not report.kept else messages.WARNING,
        )


class TeamMembershipFormSet(BaseInlineFormSet):
    """Members saved in the order of their position numbers, renumbered 0, 1, 2, ..."""

    def clean(self) -> None:
        super().clean()
        total = sum(
            form.cleaned_data.get("weight") or 0
            for form in self.forms
            if form.cleaned_data and not form.cleaned_data.get("DELETE")
        )
        if total > MAX_TEAM_WEIGHT:
            raise ValidationError(
                f"The weights add up to {total}; a team's weights may add up to at most "
                f"{MAX_TEAM_WEIGHT}."
            )

    def save(self, commit: bool = True) -> list[Any]:
        team = self.instance
        with transaction.atomic():
            # Out of the way first: the (team, position) constraint is not deferred everywhere.
            TeamMembership.objects.filter(team=team).update(position=F("position") + PARKING)
            kept = [
                form
                for form in self.forms
                if form.has_changed() or form.instance.pk is not None
                if form.cleaned_data and not form.cleaned_data.get("DELETE")
            ]
            ranked = sorted(
                enumerate(kept), key=lambda item: (item[1].cleaned_data["position"], item[0])
            )
            for rank, (_index, form) in enumerate(ranked):
                form.instance.position = 2 * PARKING + rank
            saved = super().save(commit=commit)
            team_memberships_renumber(
                team=team, membership_ids=[form.instance.pk for _i, form in ranked]
            )
        return saved


PARKING = 1_000_000


class TeamMembershipInline(admin.TabularInline):
    model = TeamMembership
    formset = TeamMembershipFormSet
    fields = ("position", "rep", "weight")
    ordering = ("position", "id")
    autocomplete_fields = ("rep",)
    extra = 0


@admin.register(Team)
class TeamAdmin(
    VersionedConfigAdmin,
    AuditedConfigAdmin,
    BoundedJsonAdmin,
    RefuseDeletingWhatRulesUse,
    admin.ModelAdmin,
):
    in_use_kind = "teams"
    versioned_locks_claimed_rows = True
    list_display = ("name", "strategy", "respect_working_hours", "sla_minutes", "member_count")
    list_filter = ("strategy", "respect_working_hours")
    search_fields = ("name",)
    autocomplete_fields = ("manager",)
    readonly_fields = ("next_up", "created_at", "updated_at")
    inlines = (TeamMembershipInline,)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Team]:
        return super().get_queryset(request).annotate(member_count=Count("memberships"))

    @admin.display(description="members", ordering="member_count")
    def member_count(self, obj: Team) -> int:
        return obj.member_count  # type: ignore[attr-defined]  # annotated in get_queryset

    @admin.display(description="next up")
    def next_up(self, obj: Team) -> str:
        if obj.pk is None:
            return "-"
        nxt = team_next_up(team=obj)
        skipped = format_html_join("", "<li>skipped {}</li>", ((line,) for line in nxt.skipped))
        return format_html(
            "<strong>{}</strong> ({})<ul>{}</ul>", nxt.rep or "nobody", nxt.why, skipped
        )


class CsvTableAdmin(VersionedConfigAdmin, AuditedConfigAdmin, BoundedJsonAdmin, admin.ModelAdmin):
    """Admin mixin: *Import CSV* and *Export CSV* pages (``routing.editor.tables``)."""

    csv_table: tables.Table = "territories"
    change_list_template = "admin/routing/csv_change_list.html"

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        model = self.model._meta.model_name
        can_import = request.user.has_perms([f"routing.add_{model}", f"routing.change_{model}"])
        return super().changelist_view(request, {**(extra_context or {}), "can_import": can_import})

    def get_urls(self) -> list[URLPattern]:
        model = self.model._meta.model_name

        def import_csv(request: HttpRequest) -> HttpResponse:
            return tables.import_view(self, request, self.csv_table)

        def export_csv(request: HttpRequest) -> StreamingHttpResponse:
            return tables.export_view(self, request, self.csv_table)

        return [
            path(
                "import/",
                self.admin_site.admin_view(import_csv),
                name=f"routing_{model}_import",
            ),
            path(
                "export/",
                self.admin_site.admin_view(export_csv),
                name=f"routing_{model}_export",
            ),
            *super().get_urls(),
        ]


@admin.register(Territory)
class TerritoryAdmin(CsvTableAdmin):
    csv_table = "territories"
    list_display = ("name", "countries", "regions", "team", "rep")
    list_select_related = ("team", "rep")
    list_filter = ("team",)
    search_fields = ("name", "team__name", "rep__email")
    autocomplete_fields = ("team", "rep")
    readonly_fields = ("created_at", "updated_at")


@admin.register(Account)
class AccountAdmin(CsvTableAdmin):
    csv_table = "accounts"
    list_display = ("domain", "name", "owner", "tier")
    list_select_related = ("owner",)
    list_filter = ("tier",)
    search_fields = ("domain", "name", "owner__email")
    autocomplete_fields = ("owner",)
    readonly_fields = ("created_at", "updated_at")


@admin.register(AdminJob)
class AdminJobAdmin(admin.ModelAdmin):
    """Background replays and imports: read-only; each opens its progress (or result) page."""

    list_display = ("job", "kind", "status", "requested_by", "created_at", "finished_at")
    list_display_links = None
    list_filter = ("kind", "status")
    list_select_related = ("requested_by",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="job")
    def job(self, obj: AdminJob) -> str:
        return format_html(
            '<a href="{}">#{}</a>',
            reverse("admin:routing_adminjob_progress", args=[obj.pk]),
            obj.pk,
        )

    def get_urls(self) -> list[URLPattern]:
        def progress(request: HttpRequest, pk: int) -> HttpResponse:
            return jobs.job_progress_view(self, request, pk)

        def status(request: HttpRequest, pk: int) -> HttpResponse:
            return jobs.job_status_view(self, request, pk)

        return [
            path(
                "<int:pk>/progress/",
                self.admin_site.admin_view(progress),
                name="routing_adminjob_progress",
            ),
            path(
                "<int:pk>/status.json",
                self.admin_site.admin_view(status),
                name="routing_adminjob_status",
            ),
            *super().get_urls(),
        ]


@admin.register(ValueList)
class ValueListAdmin(
    VersionedConfigAdmin,
    AuditedConfigAdmin,
    BoundedJsonAdmin,
    RefuseDeletingWhatRulesUse,
    admin.ModelAdmin,
):
    in_use_kind = "value_lists"
    list_display = ("name", "updated_at")
    search_fields = ("name",)
    readonly_fields = ("created_at", "updated_at")


class RefuseFrozenVersions:
    """Admin mixin: a version published between the form's check and the save is a message,
    not a server error (``RuleSet``/``Rule`` ``save()`` and ``delete()`` refuse then)."""

    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response: HttpResponse = super().changeform_view(request, *args, **kwargs)  # type: ignore[misc]
        except VersionReadOnly as exc:
            return self._refused(request, exc)
        return response

    def delete_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            response: HttpResponse = super().delete_view(request, *args, **kwargs)  # type: ignore[misc]
        except VersionReadOnly as exc:
            return self._refused(request, exc)
        return response

    def _refused(self, request: HttpRequest, exc: VersionReadOnly) -> HttpResponse:
        messages.error(request, " ".join(exc.messages))
        return HttpResponseRedirect(request.get_full_path())


def _editable(ruleset: RuleSet | None) -> bool:
    return ruleset is None or ruleset.is_editable


class RuleInline(admin.TabularInline):
    """The rules of a version in priority order, in words; edited on their own page."""

    model = Rule
    fields = ("priority", "name", "condition", "then", "active", "order")
    readonly_fields = fields
    ordering = ("priority",)
    extra = 0
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # "Add a rule" opens the rule editor

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _editable(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return _editable(obj) and super().has_delete_permission(request, obj)

    @admin.display(description="when")
    def condition(self, rule: Rule) -> str:
        return describe_condition(rule.when)

    @admin.display(description="then")
    def then(self, rule: Rule) -> str:
        return describe_action(rule.action)

    @admin.display(description="order")
    def order(self, rule: Rule) -> str:
        if not rule.ruleset.is_editable:
            return ""
        return format_html(
            '<button type="submit" class="rule-up" formaction="{}" title="Run earlier">↑</button> '
            '<button type="submit" class="rule-down" formaction="{}" title="Run later">↓</button>',
            reverse("admin:routing_rule_move", args=[rule.pk, "up"]),
            reverse("admin:routing_rule_move", args=[rule.pk, "down"]),
        )


class RuleJsonInline(admin.TabularInline):
    """Rules as JSON, for power users creating a ruleset by hand (the add page only)."""

    model = Rule
    fields = ("priority", "name", "when", "action", "sla_minutes", "on_sla_breach", "active")
    extra = 0


@admin.register(RuleSet)
class RuleSetAdmin(AuditedConfigAdmin, BoundedJsonAdmin, RefuseFrozenVersions, admin.ModelAdmin):
    list_display = (
        "version",
        "name",
        "status",
        "note_start",
        "created_at",
        "created_by",
        "published_at",
        "published_by",
    )
    list_display_links = ("version", "name")
    list_filter = ("status",)
    search_fields = ("name", "note")
    readonly_fields = (
        "version",
        "status",
        "created_by",
        "created_at",
        "published_at",
        "published_by",
    )
    fields = ("name", "note", *readonly_fields)
    inlines = (RuleInline,)
    actions = ("publish",)

    def get_inlines(self, request: HttpRequest, obj: RuleSet | None = None) -> Any:
        return (RuleInline,) if obj is not None else (RuleJsonInline,)

    @admin.action(
        description="Publish the selected draft (when its test cases pass)", permissions=["change"]
    )
    def publish(self, request: HttpRequest, queryset: QuerySet[RuleSet]) -> None:
        if queryset.count() != 1:
            self.message_user(request, "Select exactly one draft to publish.", messages.ERROR)
            return
        ruleset = queryset.get()
        try:
            published = ruleset_publish_checked(ruleset=ruleset, actor=request.user)  # type: ignore[arg-type]
        except TestCasesFailing as exc:
            self.message_user(
                request, f"Not published: {exc}. Use Publish… on the draft.", messages.ERROR
            )
            return
        except (AlreadyPublished, IntegrityError):
            self.message_user(request, views.someone_else_published(), messages.ERROR)
            return
        except RuleErrors as exc:
            self.message_user(request, f"Not published: {exc}", messages.ERROR)
            return
        except (ConfigurationBusy, LiveChangeRefused) as exc:
            self.message_user(request, f"Not published: {exc}", messages.ERROR)
            return
        self.log_change(request, published, f"Published version {published.version}")
        self.message_user(request, f"Version {published.version} is live.", messages.SUCCESS)

    def get_urls(self) -> list[URLPattern]:
        def wrap(view: Any) -> Any:
            def page(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
                return view(self, request, *args, **kwargs)

            return self.admin_site.admin_view(page)

        return [
            path("simulate/", wrap(views.simulate_view), name="routing_ruleset_simulate"),
            path("compare/", wrap(views.diff_view), name="routing_ruleset_diff"),
            path("new-draft/", wrap(views.new_draft_view), name="routing_ruleset_new_draft"),
            path(
                "<int:pk>/new-draft/",
                wrap(views.new_draft_view),
                name="routing_ruleset_copy",
            ),
            path("<int:pk>/replay/", wrap(views.replay_view), name="routing_ruleset_replay"),
            path("<int:pk>/tests/", wrap(views.tests_view), name="routing_ruleset_tests"),
            path("<int:pk>/publish/", wrap(views.publish_view), name="routing_ruleset_publish"),
            path("<int:pk>/rollback/", wrap(views.rollback_view), name="routing_ruleset_rollback"),
            *super().get_urls(),
        ]

    @admin.display(description="note (latest line)")
    def note_start(self, obj: RuleSet) -> str:
        # A note given at publish is added as the last line (after "Copy of version N"): the
        # line that says what changed and why.
        lines = [line.strip() for line in (obj.note or "").splitlines() if line.strip()]
        return lines[-1][:120] if lines else ""

    def has_change_permission(self, request: HttpRequest, obj: RuleSet | None = None) -> bool:
        return _editable(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: RuleSet | None = None) -> bool:
        return _editable(obj) and super().has_delete_permission(request, obj)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # it would skip the per-version check
        return actions

    def get_queryset(self, request: HttpRequest) -> QuerySet[RuleSet]:
        return super().get_queryset(request).select_related("created_by", "published_by")

    def save_model(self, request: HttpRequest, obj: RuleSet, form: Any, change: bool) -> None:
        if change:
            # Only what the form edits: a full-row save of this (possibly stale) object would
            # write its status back over a publish that happened meanwhile. save() locks the
            # row and refuses unless it is still a draft.
            obj.save(update_fields=["name", "note"])
        else:
            ruleset_add_draft(ruleset=obj, actor=request.user)  # type: ignore[arg-type]


@admin.register(Rule)
class RuleAdmin(AuditedConfigAdmin, BoundedJsonAdmin, RefuseFrozenVersions, admin.ModelAdmin):
    """The rule editor: the condition as rows, the action as fields; lists in priority order."""

    form = RuleForm
    list_display = ("priority", "name", "condition", "then", "ruleset", "active")
    list_display_links = ("priority", "name")
    list_select_related = ("ruleset",)
    list_filter = ("ruleset", "ruleset__status", "active")
    search_fields = ("name",)
    ordering = ("-ruleset__version", "priority")
    fieldsets = (
        (None, {"fields": ("ruleset", "name", "priority", "active")}),
        ("When", {"fields": ("when",)}),
        (
            "Then",
            {
                "fields": (
                    "action_type",
                    "action_team",
                    "action_rep",
                    "action_ignore_caps",
                    "action_fallback_team",
                    "action_reason",
                    "tag_priority",
                    "tag_sla_minutes",
                    "tag_tags",
                    "action",
                )
            },
        ),
        ("First-touch SLA", {"fields": ("sla_minutes", "on_sla_breach")}),
    )
    readonly_fieldsets = (
        (None, {"fields": ("ruleset", "name", "priority", "active")}),
        ("In words", {"fields": ("condition", "then")}),
        ("As JSON", {"fields": ("when", "action")}),
        ("First-touch SLA", {"fields": ("sla_minutes", "on_sla_breach")}),
    )

    def get_urls(self) -> list[URLPattern]:
        def move(request: HttpRequest, pk: int, direction: str) -> HttpResponse:
            return views.rule_move_view(self, request, pk, direction)

        return [
            path(
                "<int:pk>/move/<str:direction>/",
                self.admin_site.admin_view(move),
                name="routing_rule_move",
            ),
            *super().get_urls(),
        ]

    def get_fieldsets(self, request: HttpRequest, obj: Rule | None = None) -> Any:
        if obj is not None and not _editable(obj.ruleset):
            return self.readonly_fieldsets
        return self.fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Rule | None = None) -> Any:
        if obj is not None and not _editable(obj.ruleset):
            return ("condition", "then")
        return ()

    def get_form(
        self, request: HttpRequest, obj: Any | None = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is not None and not _editable(obj.ruleset):
            kwargs["fields"] = [
                "ruleset",
                "name",
                "priority",
                "active",
                "when",
                "action",
                "sla_minutes",
                "on_sla_breach",
            ]
        return super().get_form(request, obj, change, **kwargs)

    def get_changeform_initial_data(self, request: HttpRequest) -> dict[str, Any]:
        initial: dict[str, Any] = dict(super().get_changeform_initial_data(request))
        if "ruleset" not in initial:
            draft = RuleSet.objects.filter(status=RuleSetStatus.DRAFT).order_by("-version").first()
            if draft is not None:
                initial["ruleset"] = draft.pk
        return initial

    @admin.display(description="when")
    def condition(self, rule: Rule) -> str:
        return describe_condition(rule.when)

    @admin.display(description="then")
    def then(self, rule: Rule) -> str:
        return describe_action(rule.action)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # it would skip the per-rule check below
        return actions

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "ruleset":
            kwargs["queryset"] = RuleSet.objects.filter(status=RuleSetStatus.DRAFT)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_change_permission(self, request: HttpRequest, obj: Rule | None = None) -> bool:
        return (obj is None or _editable(obj.ruleset)) and super().has_change_permission(
            request, obj
        )

    def has_delete_permission(self, request: HttpRequest, obj: Rule | None = None) -> bool:
        return (obj is None or _editable(obj.ruleset)) and super().has_delete_permission(
            request, obj
        )

    def _back_to_ruleset(self, request: HttpRequest, obj: Rule) -> HttpResponse | None:
        if "_continue" in request.POST or "_addanother" in request.POST:
            return None
        return HttpResponseRedirect(
            reverse("admin:routing_ruleset_change", args=[obj.ruleset_id]) + "#rules-group"
        )

    def response_add(self, request: HttpRequest, obj: Rule, post_url_continue: Any = None) -> Any:
        response = super().response_add(request, obj, post_url_continue)
        return self._back_to_ruleset(request, obj) or response

    def response_change(self, request: HttpRequest, obj: Rule) -> Any:
        response = super().response_change(request, obj)
        return self._back_to_ruleset(request, obj) or response


@admin.register(RoutingTestCase)
class RoutingTestCaseAdmin(
    VersionedConfigAdmin, AuditedConfigAdmin, BoundedJsonAdmin, admin.ModelAdmin
):
    versioned_test_cases = False  # a test case saved is a test, not a change of routing
    form = RoutingTestCaseForm
    list_display = ("name", "expected_status", "expected_rep", "expected_team", "source")
    list_select_related = ("expected_rep", "expected_team", "source")
    list_filter = ("expected_status",)
    search_fields = ("name",)
    autocomplete_fields = ("expected_rep", "expected_team")
    readonly_fields = ("created_at", "updated_at")


@admin.register(QueueHeartbeat)
class QueueHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("queue", "last_seen_at", "worker")
    readonly_fields = ("queue", "last_seen_at", "worker")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


from routing.config_api import admin as config_api_admin  # noqa: E402,F401
from routing.crm import admin as crm_admin  # noqa: E402,F401
from routing.delivery import admin as delivery_admin  # noqa: E402,F401
from routing.drafts import admin as drafts_admin  # noqa: E402,F401
from routing.monitoring import admin as monitoring_admin  # noqa: E402,F401
from routing.timeoff import admin as timeoff_admin  # noqa: E402,F401
