from django.contrib import admin
from django.http import HttpRequest

from routing.models import QueueHeartbeat


@admin.register(QueueHeartbeat)
class QueueHeartbeatAdmin(admin.ModelAdmin):
    list_display = ("queue", "last_seen_at", "worker")
    readonly_fields = ("queue", "last_seen_at", "worker")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
