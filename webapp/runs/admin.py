from django.contrib import admin
from django.http import HttpRequest

from webapp.runs.models import (
    FaultEvent,
    Generation,
    MetricPoint,
    Plan,
    Run,
    RunDevice,
    TimelineEvent,
    WeightReplica,
)


class RunDeviceInline(admin.TabularInline):
    model = RunDevice
    extra = 0
    raw_id_fields = ("device",)


class PlanInline(admin.TabularInline):
    model = Plan
    extra = 0
    fields = ("algorithm", "status", "period_s", "throughput_sps", "simulated_throughput_sps",
              "memory_ok", "planner_s", "attempts", "error")
    readonly_fields = fields
    show_change_link = True


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "model_spec", "state", "schedule", "microbatches",
                    "created_at")
    list_filter = ("state", "schedule")
    search_fields = ("name",)
    readonly_fields = ("state", "chosen_plan", "generation", "recovery", "created_at",
                       "updated_at", "started_at", "finished_at")
    inlines = (RunDeviceInline, PlanInline)


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ("id", "run", "algorithm", "status", "period_s", "throughput_sps",
                    "simulated_throughput_sps", "memory_ok", "planner_s", "attempts")
    list_filter = ("status", "algorithm")
    raw_id_fields = ("run",)


@admin.register(TimelineEvent)
class TimelineEventAdmin(admin.ModelAdmin):
    list_display = ("run", "device", "stage", "kind", "microbatch", "start", "end")
    list_filter = ("kind",)
    raw_id_fields = ("run",)


@admin.register(FaultEvent)
class FaultEventAdmin(admin.ModelAdmin):
    list_display = ("run", "at", "kind", "device")
    list_filter = ("kind",)
    raw_id_fields = ("run",)


@admin.register(MetricPoint)
class MetricPointAdmin(admin.ModelAdmin):
    list_display = ("run", "at", "kind", "device", "value")
    list_filter = ("kind",)
    raw_id_fields = ("run",)


@admin.register(RunDevice)
class RunDeviceAdmin(admin.ModelAdmin):
    list_display = ("run", "position", "device", "stage", "stage_state")
    list_filter = ("stage_state",)
    raw_id_fields = ("run", "device")
    readonly_fields = ("holdings",)


@admin.register(Generation)
class GenerationAdmin(admin.ModelAdmin):
    """Written by the recovery and the dynamic re-partition only: shown, not edited."""

    list_display = ("run", "number", "cause", "planner", "predicted_throughput_sps",
                    "resume_microbatch", "detected_at", "resumed_at", "bytes_moved")
    list_filter = ("cause", "planner")
    raw_id_fields = ("run",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WeightReplica)
class WeightReplicaAdmin(admin.ModelAdmin):
    """Uploaded by agents only; deleting a row deletes its file (webapp.runs.replicas)."""

    list_display = ("run", "first", "last", "applied", "device", "bytes", "created_at")
    raw_id_fields = ("run",)
    search_fields = ("device",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
