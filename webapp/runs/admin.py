from django.contrib import admin

from webapp.runs.models import FaultEvent, MetricPoint, Plan, Run, RunDevice, TimelineEvent


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
    readonly_fields = ("state", "chosen_plan", "created_at", "updated_at", "started_at",
                       "finished_at")
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
    list_display = ("run", "position", "device")
    raw_id_fields = ("run", "device")
