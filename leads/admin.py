"""Admin for sources (token shown once, rotation) and leads (read-only)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied, RequestDataTooBig, TooManyFieldsSent
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect

from audit.config_changes import AuditedConfigAdmin, actor_of, config_change_record, values_of
from config.json_input import BoundedJsonAdmin
from leads.inbox import refused_dismiss, refused_reaccept
from leads.models import (
    Lead,
    RefusedPayload,
    RefusedState,
    Source,
    SourceAuthMode,
    status_reveal_default,
)
from leads.priority import priority_clean
from leads.services import source_set_hmac_secret, source_set_token
from leads.sources import kind_choices, kind_get, options_masked, options_unmasked
from leads.tryit import (
    Sample,
    SourceTryForm,
    TryInputError,
    TryResult,
    posted_too_big,
    source_sample,
    source_samples,
    source_try,
)
from routing.editor.versioned import VersionedConfigAdmin


def _overlap() -> timedelta:
    return timedelta(hours=settings.SOURCE_TOKEN_OVERLAP_HOURS)


class NewSecret(NamedTuple):
    """A token or secret just generated, shown once on the page that answers the request."""

    slug: str
    kind: str  # "Token", "HMAC secret"
    value: str
    old_until: str  # what happens to the previous value, in words ("" for a new source)


def _old_until(until: datetime | None) -> str:
    if until is None:
        return "The previous value (if any) stopped working now."
    return f"The previous value keeps working until {until:%Y-%m-%d %H:%M} UTC."


def _rotated(request: HttpRequest, source: Source, action: str, before: dict[str, Any]) -> None:
    config_change_record(
        actor=actor_of(request), obj=source, action=action, before=before, after=values_of(source)
    )


def _secrets_page(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, shown: list[NewSecret]
) -> TemplateResponse:
    """The new values in the response itself, never in a message (messages may be stored in
    a cookie): copy them now, they are not shown again."""
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Copy the new values now",
        "shown": shown,
        "changelist": reverse("admin:leads_source_changelist"),
    }
    response = TemplateResponse(request, "admin/leads/source/new_secrets.html", context)
    response["Cache-Control"] = "no-store"
    return response


class SourceForm(forms.ModelForm):
    """The source's kind as a choice of the built-in kinds, and the vendor's secret write-only."""

    kind = forms.ChoiceField(
        choices=kind_choices,
        initial="generic",
        required=False,
        help_text="The tool that posts here: its payload is decoded with no field map by hand. "
        "docs/revops.md has a recipe per tool.",
    )
    new_vendor_secret = forms.CharField(
        required=False,
        label="Vendor secret",
        strip=True,
        max_length=512,
        widget=forms.PasswordInput(render_value=False),
        help_text="The secret the tool signs its requests with (auth mode 'vendor'), as the "
        "tool shows it. Never shown again; leave blank to keep the current one.",
    )

    class Meta:
        model = Source
        fields = (
            "slug",
            "name",
            "active",
            "kind",
            "kind_options",
            "auth_mode",
            "allow_query_token",
            "field_map",
            "rate_limit_per_minute",
            "lane",
            "intake_priority",
            "status_minutes",
            "status_reveal",
            "cors_origins",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "status_minutes" in self.fields:  # left out: the default (10 minutes)
            self.fields["status_minutes"].required = False
        if self.instance.pk:  # a secret kind option (a page token) is never shown again
            self.initial["kind_options"] = options_masked(
                self.instance.kind, self.instance.kind_options
            )

    def clean_kind(self) -> str:
        return self.cleaned_data.get("kind") or "generic"

    def clean_intake_priority(self) -> str:
        return priority_clean(self.cleaned_data.get("intake_priority"))

    def clean_status_minutes(self) -> int:
        minutes = self.cleaned_data.get("status_minutes")
        return int(minutes) if minutes else int(Source._meta.get_field("status_minutes").default)

    def clean_status_reveal(self) -> Any:
        reveal = self.cleaned_data.get("status_reveal")
        return status_reveal_default() if reveal is None else reveal

    def clean_kind_options(self) -> Any:
        stored = Source.objects.filter(pk=self.instance.pk).values_list("kind_options", flat=True)
        return options_unmasked(self.cleaned_data.get("kind_options"), stored.first())

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("auth_mode") == SourceAuthMode.VENDOR:
            kind = kind_get(data.get("kind"))
            if kind.verify is None:
                self.add_error(
                    "auth_mode", f"The {kind.label} kind has no signature of its own to check."
                )
            has_secret = bool(data.get("new_vendor_secret")) or bool(
                self.instance.pk and self.instance.vendor_secret
            )
            if not has_secret:
                self.add_error("new_vendor_secret", "Enter the secret the tool signs with.")
        return data

    def save(self, commit: bool = True) -> Source:
        secret = self.cleaned_data.get("new_vendor_secret")
        if secret:
            self.instance.vendor_secret = secret
        return super().save(commit=commit)


@admin.register(Source)
class SourceAdmin(VersionedConfigAdmin, AuditedConfigAdmin, BoundedJsonAdmin, admin.ModelAdmin):
    form = SourceForm
    list_display = (
        "slug",
        "name",
        "kind",
        "active",
        "auth_mode",
        "token_hint",
        "rate_limit_per_minute",
        "lane_shown",
    )
    list_filter = ("active", "kind", "auth_mode", "lane")
    search_fields = ("slug", "name")
    readonly_fields = (
        "token_hint",
        "previous_token_valid_until",
        "previous_hmac_valid_until",
        "created_at",
        "updated_at",
    )
    fields = (
        "slug",
        "name",
        "active",
        "kind",
        "kind_options",
        "auth_mode",
        "allow_query_token",
        "new_vendor_secret",
        "field_map",
        "rate_limit_per_minute",
        "lane",
        "intake_priority",
        "status_minutes",
        "status_reveal",
        "cors_origins",
        "retention_raw_payload_days",
        "retention_unrouted_days",
        "retention_personal_days",
        *readonly_fields,
    )
    actions = ("rotate_token", "rotate_hmac_secret")
    change_form_template = "admin/leads/source/change_form.html"

    @admin.display(description="lane", ordering="lane")
    def lane_shown(self, obj: Source) -> str:
        """The source's lane, or what a blank one means."""
        return obj.get_lane_display() if obj.lane else "by intake (form: realtime, batch: bulk)"

    def get_urls(self) -> list[URLPattern]:
        # try_view checks CSRF itself, after the size check: the middleware reads the POST
        # first, and a paste over DATA_UPLOAD_MAX_MEMORY_SIZE would then be a bare 400 page.
        view = csrf_exempt(self.try_view)
        return [
            path(
                "<path:object_id>/try/",
                self.admin_site.admin_view(view),
                name="leads_source_try",
            ),
            *super().get_urls(),
        ]

    def try_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """Try a payload with a kind and field map before saving them (leads.tryit)."""
        source = self.get_object(request, unquote(object_id))
        if source is None:
            # The admin's own "doesn't exist" redirect and message (missing from the stubs).
            return self._get_obj_does_not_exist_redirect(  # type: ignore[attr-defined]
                request, self.opts, object_id
            )
        if not self.has_view_or_change_permission(request, source):
            raise PermissionDenied
        leads, with_refused = self._try_visible(request)
        samples = source_samples(source=source, leads=leads, with_refused=with_refused)
        if request.method == "POST" and posted_too_big(request.META):
            return self._try_page(request, source, SourceTryForm.too_big(source, samples))
        return csrf_protect(self._try_checked)(request, source, leads, with_refused, samples)

    def _try_checked(
        self,
        request: HttpRequest,
        source: Source,
        leads: QuerySet[Lead] | None,
        with_refused: bool,
        samples: list[Sample],
    ) -> HttpResponse:
        if request.method != "POST":
            initial = SourceTryForm.initial_for(source)
            return self._try_page(request, source, SourceTryForm(initial=initial, samples=samples))
        try:
            data = request.POST.copy()
        except (RequestDataTooBig, TooManyFieldsSent):
            return self._try_page(request, source, SourceTryForm.too_big(source, samples))
        key = data.get("sample", "")
        if "_load" in data and key:
            sample = source_sample(source=source, key=key, leads=leads, with_refused=with_refused)
            if sample is not None:
                data["payload"], data["fmt"] = sample.text, sample.fmt
        form = SourceTryForm(data, samples=samples)
        result = None
        if form.is_valid():
            try:
                result = source_try(
                    source=source,
                    text=form.cleaned_data["payload"],
                    fmt=form.cleaned_data["fmt"],
                    kind=form.cleaned_data["kind"],
                    kind_options=form.cleaned_data["kind_options"],
                    field_map=form.cleaned_data["field_map"],
                )
            except TryInputError as error:
                for name, problems in error.errors.items():
                    form.add_error(name, problems)
        return self._try_page(request, source, form, result)

    def _try_visible(self, request: HttpRequest) -> tuple[QuerySet[Lead] | None, bool]:
        """The leads whose payloads the person may pick (None: none), and whether refusals."""
        user = request.user
        leads = None
        if user.has_perm("leads.view_lead"):
            from audit.selectors import leads_visible_to  # audit builds on leads

            leads = leads_visible_to(user, Lead.objects.all())
        return leads, user.has_perm("leads.view_refusedpayload")

    def _try_page(
        self,
        request: HttpRequest,
        source: Source,
        form: SourceTryForm,
        result: TryResult | None = None,
    ) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "original": source,
            "title": f"Try a payload: {source}",
            "form": form,
            "result": result,
        }
        return TemplateResponse(request, "admin/leads/source/try.html", context)

    def save_model(self, request: HttpRequest, obj: Source, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        shown: list[NewSecret] = []
        if not change:
            token = source_set_token(source=obj)
            shown.append(NewSecret(obj.slug, "Token", token, ""))
        if obj.requires_signature and not obj.hmac_secret:
            secret = source_set_hmac_secret(source=obj)
            shown.append(NewSecret(obj.slug, "HMAC secret", secret, ""))
        request._new_secrets = shown  # type: ignore[attr-defined]  # read by response_*

    def _secrets_or(self, request: HttpRequest, response: HttpResponse) -> HttpResponse:
        shown = getattr(request, "_new_secrets", None)
        return _secrets_page(self, request, shown) if shown else response

    def response_add(self, request: HttpRequest, obj: Source, post_url_continue: Any = None) -> Any:
        return self._secrets_or(request, super().response_add(request, obj, post_url_continue))

    def response_change(self, request: HttpRequest, obj: Source) -> Any:
        return self._secrets_or(request, super().response_change(request, obj))

    @admin.action(
        description="Rotate token (the old one keeps working for the overlap period)",
        permissions=["change"],
    )
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[Source]) -> TemplateResponse:
        shown = []
        for source in queryset:
            before = values_of(source)
            token = source_set_token(source=source, overlap=_overlap())
            _rotated(request, source, "rotate_token", before)
            shown.append(
                NewSecret(
                    source.slug, "Token", token, _old_until(source.previous_token_valid_until)
                )
            )
        return _secrets_page(self, request, shown)

    @admin.action(
        description="Rotate HMAC secret (the old one keeps working for the overlap)",
        permissions=["change"],
    )
    def rotate_hmac_secret(
        self, request: HttpRequest, queryset: QuerySet[Source]
    ) -> TemplateResponse:
        shown = []
        for source in queryset:
            before = values_of(source)
            secret = source_set_hmac_secret(source=source, overlap=_overlap())
            _rotated(request, source, "rotate_hmac_secret", before)
            shown.append(
                NewSecret(
                    source.slug,
                    "HMAC secret",
                    secret,
                    _old_until(source.previous_hmac_valid_until),
                )
            )
        return _secrets_page(self, request, shown)


class EraseForm(forms.Form):
    reason = forms.CharField(
        max_length=500,
        strip=True,
        help_text="Why (recorded in the audit log with your name; nothing personal), e.g. "
        "“GDPR art. 17 request, ticket 4711”.",
        widget=forms.TextInput(attrs={"size": 60}),
    )


@admin.register(Lead)
class LeadAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "email",
        "company",
        "country",
        "source",
        "status",
        "enrichment_status",
        "received_at",
        "last_error",
    )
    # Enrichment status, attempts, next try and what each provider got (`enrichment`) show
    # read-only on the lead's page with every other field.
    list_filter = ("status", "lane", "enrichment_status", "fetch_status", "source")
    search_fields = ("email", "company", "last_name")
    list_select_related = ("source",)
    date_hierarchy = "received_at"
    show_full_result_count = False
    actions = ("reroute", "fetch_again", "export_person", "erase_person")

    @admin.action(
        description="Export everything about these leads' people (JSON)", permissions=["export"]
    )
    def export_person(self, request: HttpRequest, queryset: QuerySet[Lead]) -> HttpResponse:
        """Subject access: one JSON file, a document per person (audit.subject_access)."""
        import json

        from audit.subject_access import person_export  # audit builds on leads
        from routing.erasure import person_of_lead  # routing builds on leads

        actor = f"user:{request.user.get_username()}"
        people: list[dict[str, Any]] = []
        seen: set[str] = set()
        for lead in queryset.select_related(None).only("id", "email", "phone")[:100]:
            if str(lead.pk) in seen:
                continue
            email, phone = person_of_lead(lead)
            document = person_export(email=email, phone=phone, actor=actor, lead_ids=[lead.pk])
            seen |= {item["id"] for item in document["leads"]}
            people.append(document)
        body = people[0] if len(people) == 1 else {"people": people}
        response = HttpResponse(
            json.dumps(body, indent=2, ensure_ascii=False, default=str),
            content_type="application/json; charset=utf-8",
        )
        response["Content-Disposition"] = 'attachment; filename="subject-access.json"'
        response["Cache-Control"] = "no-store"
        return response

    def has_export_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("leads.export_person")

    @admin.action(description="Erase these leads' people (personal data)", permissions=["erase"])
    def erase_person(
        self, request: HttpRequest, queryset: QuerySet[Lead]
    ) -> TemplateResponse | None:
        """Each selected lead's person erased (all their leads), after a page asking why."""
        from routing.erasure import lead_person_erase  # routing builds on leads

        form = EraseForm(request.POST if "apply" in request.POST else None)
        leads = list(
            queryset.select_related(None).only("id", "email", "first_name", "last_name", "phone")[
                :100
            ]
        )
        if form.is_valid():
            actor = f"user:{request.user.get_username()}"
            erased, before = set(), 0
            for lead in leads:
                if str(lead.pk) in erased:
                    continue  # erased with an earlier lead of the same person
                try:
                    result = lead_person_erase(
                        lead_id=lead.pk, actor=actor, reason=form.cleaned_data["reason"]
                    )
                except Lead.DoesNotExist:
                    continue
                if result.leads:
                    erased |= set(result.lead_ids)
                else:
                    before += 1
            if erased:
                self.message_user(
                    request, f"{len(erased)} lead(s) erased, with their people.", messages.SUCCESS
                )
            if before:
                self.message_user(
                    request, f"{before} lead(s) had been erased before.", messages.INFO
                )
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Erase these people",
            "form": form,
            "leads": leads,
            "action": "erase_person",
            "action_checkbox_name": ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/leads/lead/erase.html", context)

    def has_erase_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("leads.erase_lead")

    @admin.action(
        description="Fetch from Meta again (leads whose fetch failed)", permissions=["reroute"]
    )
    def fetch_again(self, request: HttpRequest, queryset: QuerySet[Lead]) -> None:
        from routing.fetch.meta import leads_meta_fetch_retry  # routing builds on leads

        if not request.user.has_perm("leads.reroute_lead"):
            messages.error(request, "You may not re-route leads.")
            return
        ids = list(queryset.values_list("id", flat=True))
        done = leads_meta_fetch_retry(lead_ids=ids, actor=f"user:{request.user.get_username()}")
        messages.success(request, f"{done} lead(s) sent to be fetched from Meta again.")
        if done < len(ids):
            messages.warning(
                request, f"{len(ids) - done} lead(s) skipped: their fetch has not failed."
            )

    @admin.action(description="Re-route (unassigned or failed leads)", permissions=["reroute"])
    def reroute(self, request: HttpRequest, queryset: QuerySet[Lead]) -> None:
        from routing.services import LeadActionError, lead_reroute  # routing builds on leads

        if not request.user.has_perm("leads.reroute_lead"):
            messages.error(request, "You may not re-route leads.")
            return
        done, refused = 0, []
        for lead in queryset.only("id"):
            try:
                lead_reroute(lead_id=lead.pk, actor=f"user:{request.user.get_username()}")
                done += 1
            except LeadActionError as error:
                refused.append(f"{lead.pk}: {error.message}")
        if done:
            messages.success(request, f"{done} lead(s) sent through routing again.")
        for line in refused[:20]:
            messages.warning(request, line)

    def has_reroute_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("leads.reroute_lead")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lead]:
        """Scoped like the history pages: a manager who is also staff, under
        HISTORY_SCOPE_TO_MANAGED_TEAMS, finds here only the leads owned within their teams
        (another team's lead is "not found", as on /history/<id>/)."""
        from audit.selectors import leads_visible_to  # audit builds on leads

        return leads_visible_to(request.user, super().get_queryset(request))

    def get_readonly_fields(self, request: HttpRequest, obj: Lead | None = None) -> list[str]:
        return [f.name for f in Lead._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False


@admin.register(RefusedPayload)
class RefusedPayloadAdmin(admin.ModelAdmin):
    """The refused inbox: fix the source's kind or map, then re-accept (audited, idempotent)."""

    list_display = ("id", "source", "received_at", "status_code", "reason", "state", "lead")
    list_filter = ("state", "reason", "source")
    list_select_related = ("source",)
    date_hierarchy = "received_at"
    show_full_result_count = False
    actions = ("reaccept", "dismiss")
    readonly_fields = (
        "source",
        "received_at",
        "content_type",
        "headers",
        "body_text",
        "batch_index",
        "status_code",
        "reason",
        "message",
        "state",
        "lead",
        "handled_at",
        "handled_by",
    )
    fields = readonly_fields

    @admin.display(description="Body (as sent)")
    def body_text(self, obj: RefusedPayload) -> str:
        raw = bytes(obj.body or b"")
        text = raw[:200_000].decode("utf-8", "replace")
        return text + ("\n… (cut at 200,000 bytes)" if len(raw) > 200_000 else "")

    @admin.action(
        description="Re-accept as leads (read by the source as it is now)", permissions=["change"]
    )
    def reaccept(self, request: HttpRequest, queryset: QuerySet[RefusedPayload]) -> None:
        actor = actor_of(request)
        done, already, failed = 0, 0, []
        for refused_id in queryset.order_by("received_at", "id").values_list("id", flat=True):
            outcome = refused_reaccept(refused_id=refused_id, actor=actor)
            if outcome.error:
                failed.append(f"#{refused_id}: {outcome.error}")
            elif outcome.already:
                already += 1
            else:
                done += 1
        if done:
            messages.success(request, f"{done} payload(s) re-accepted as leads.")
        if already:
            messages.info(request, f"{already} payload(s) were already re-accepted.")
        for line in failed[:20]:
            messages.warning(request, line)
        if len(failed) > 20:
            messages.warning(request, f"… and {len(failed) - 20} more still refused.")

    @admin.action(description="Dismiss (not leads)", permissions=["change"])
    def dismiss(self, request: HttpRequest, queryset: QuerySet[RefusedPayload]) -> None:
        count = refused_dismiss(
            refused_ids=queryset.filter(state=RefusedState.OPEN).values_list("id", flat=True),
            actor=actor_of(request),
        )
        messages.success(request, f"{count} payload(s) dismissed.")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The actions need "change"; the page itself stays read-only (readonly_fields).
        return request.user.has_perm("leads.change_refusedpayload")
