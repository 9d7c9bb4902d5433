"""Admin for scoped API tokens: create one (its secret shown once), revoke."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from audit.config_changes import actor_of
from routing.config_api.models import ApiToken, ApiTokenScope
from routing.config_api.tokens import ApiTokenInvalid, api_token_create, api_token_revoke


class ApiTokenForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiTokenScope.choices, widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = ApiToken
        fields = ("name", "user", "scopes", "expires_at")


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    form = ApiTokenForm
    list_display = (
        "name",
        "user",
        "scopes",
        "hint",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
    )
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username")
    list_select_related = ("user",)
    autocomplete_fields = ("user",)
    actions = ("revoke",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return (
            "name",
            "user",
            "scopes",
            "hint",
            "created_at",
            "last_used_at",
            "expires_at",
            "revoked_at",
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the audit trail keeps naming the token

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        try:
            created = api_token_create(
                user=form.cleaned_data["user"],
                name=form.cleaned_data["name"],
                scopes=form.cleaned_data["scopes"],
                expires_at=form.cleaned_data.get("expires_at"),
                actor=actor_of(request),
            )
        except ApiTokenInvalid as exc:  # the form checked the name; a race is left
            self.message_user(request, str(exc), messages.ERROR)
            raise
        obj.pk = created.token.pk
        obj.__dict__.update(
            {f.attname: getattr(created.token, f.attname) for f in obj._meta.concrete_fields}
        )
        request.__dict__["_new_api_token_secret"] = created.secret

    def response_add(
        self, request: HttpRequest, obj: ApiToken, post_url_continue: Any = None
    ) -> Any:
        """The secret in the response itself, never in a message (messages may be stored in a
        cookie): copy it now, it is not shown again."""
        secret = request.__dict__.get("_new_api_token_secret")
        if secret is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Copy the new token now",
            "token": obj,
            "secret": secret,
            "changelist": reverse("admin:routing_apitoken_changelist"),
        }
        response = TemplateResponse(request, "admin/routing/apitoken/new_secret.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke (refused from now on)", permissions=["view"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            api_token_revoke(token_id=token.pk, actor=actor_of(request))
        self.message_user(request, f"{queryset.count()} token(s) revoked.", messages.SUCCESS)
