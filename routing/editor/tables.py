"""Import and export of territories and accounts as CSV, from their admin lists.

A small file is checked and written while the page loads; a large one (more than
``ADMIN_IMPORT_SYNC_MAX_ROWS`` rows) becomes a background job with a progress page. Either way
every problem is listed by row and column and nothing is written unless the whole file is right
(``routing.tables_io``). Export streams the CSV, formula-safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from routing.admin_jobs import admin_job_start_import
from routing.drafts.live import LiveChangeRefused
from routing.rules_io import ConfigurationBusy
from routing.tables_io import (
    ACCOUNT_COLUMNS,
    TERRITORY_COLUMNS,
    Table,
    TableErrors,
    accounts_export_lines,
    csv_data_rows,
    tables_import,
    territories_export_lines,
)
from routing.versions import TestCasesFailing

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

MODEL = {"territories": "territory", "accounts": "account"}
COLUMNS = {"territories": TERRITORY_COLUMNS, "accounts": ACCOUNT_COLUMNS}


class TableImportForm(forms.Form):
    file = forms.FileField(label="CSV file")
    delete_missing = forms.BooleanField(required=False, label="Delete the ones not in the file")
    force_failing_test_cases = forms.BooleanField(
        required=False,
        label="Import even though saved test cases fail (recorded with your name and the cases)",
    )

    def clean_file(self) -> Any:
        upload = self.cleaned_data["file"]
        if upload.size > settings.ADMIN_IMPORT_MAX_BYTES:
            raise forms.ValidationError(
                f"The file is {upload.size:,} bytes; at most "
                f"{settings.ADMIN_IMPORT_MAX_BYTES:,} can be imported."
            )
        return upload


def _require(request: HttpRequest, *codenames: str) -> None:
    if not all(request.user.has_perm(f"routing.{codename}") for codename in codenames):
        raise PermissionDenied


def import_view(model_admin: ModelAdmin[Any], request: HttpRequest, table: Table) -> HttpResponse:
    """Upload a CSV: written at once when small and right, a background job when large."""
    model = MODEL[table]
    _require(request, f"add_{model}", f"change_{model}")
    form = TableImportForm(request.POST or None, request.FILES or None)
    errors: tuple[str, ...] = ()
    more = 0
    if request.method == "POST" and form.is_valid():
        delete_missing = form.cleaned_data["delete_missing"]
        force = form.cleaned_data["force_failing_test_cases"]
        if delete_missing:
            _require(request, f"delete_{model}")
        upload = form.cleaned_data["file"]
        content = upload.read()
        try:
            text = content.decode("utf-8-sig")
        except UnicodeDecodeError:
            errors = ("row 1: the file is not UTF-8 text (save it as CSV UTF-8)",)
        else:
            if csv_data_rows(text) > settings.ADMIN_IMPORT_SYNC_MAX_ROWS:
                job = admin_job_start_import(
                    table=table,
                    content=text,
                    file_name=upload.name or "",
                    delete_missing=delete_missing,
                    actor=request.user,  # type: ignore[arg-type]
                    force=force,
                )
                return HttpResponseRedirect(
                    reverse("admin:routing_adminjob_progress", args=[job.pk])
                )
            try:
                report = tables_import(
                    table=table,
                    content=text,
                    actor=request.user,  # type: ignore[arg-type]
                    file_name=upload.name or "",
                    delete_missing=delete_missing,
                    test_cases=True,
                    force=force,
                )
            except TableErrors as exc:
                errors, more = exc.errors, exc.more
            except (ConfigurationBusy, LiveChangeRefused) as exc:
                errors = (str(exc),)
            except TestCasesFailing as exc:
                failing = [
                    f"after this import the saved test case {result.case.name} fails: "
                    + "; ".join(result.problems)
                    for result in exc.results
                    if not result.passed
                ]
                errors = (
                    *failing,
                    'Tick "Import even though saved test cases fail" and import again to '
                    "import it anyway (recorded with your name and the cases).",
                )
            else:
                messages.success(
                    request,
                    f"Imported {report.rows} row(s): {report.created} {table} created, "
                    f"{report.updated} updated, {report.unchanged} unchanged, "
                    f"{report.deleted} deleted.",
                )
                return HttpResponseRedirect(reverse(f"admin:routing_{model}_changelist"))
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": f"Import {table} from CSV",
        "table": table,
        "columns": ",".join(COLUMNS[table]),
        "form": form,
        "errors": errors,
        "more_errors": more,
        "sync_max": settings.ADMIN_IMPORT_SYNC_MAX_ROWS,
    }
    return TemplateResponse(request, "admin/routing/import_csv.html", context)


def export_view(
    model_admin: ModelAdmin[Any], request: HttpRequest, table: Table
) -> StreamingHttpResponse:
    """Every territory or account as CSV, streamed; imports back to the same data."""
    _require(request, f"view_{MODEL[table]}")
    lines = territories_export_lines() if table == "territories" else accounts_export_lines()
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    stamp = timezone.now().strftime("%Y%m%d-%H%M")
    response["Content-Disposition"] = f'attachment; filename="{table}-{stamp}.csv"'
    return response
