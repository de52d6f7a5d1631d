from django.contrib import admin

from webapp.split.models import SplitSchedule, SplitStudy


class SplitScheduleInline(admin.TabularInline):
    model = SplitSchedule
    extra = 0
    fields = ("method", "status", "makespan", "lower_bound", "solver_s", "error")
    readonly_fields = fields
    show_change_link = True


@admin.register(SplitStudy)
class SplitStudyAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "source", "clients", "helpers", "time_limit_s",
                    "switch_slots", "created_at")
    search_fields = ("name", "source")
    readonly_fields = ("created_at",)
    inlines = (SplitScheduleInline,)


@admin.register(SplitSchedule)
class SplitScheduleAdmin(admin.ModelAdmin):
    list_display = ("id", "study", "method", "status", "makespan", "lower_bound", "solver_s",
                    "finished_at")
    list_filter = ("status", "method")
    raw_id_fields = ("study",)
