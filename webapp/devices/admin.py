from django.contrib import admin

from webapp.devices.models import Device, DeviceLink, EnrollmentToken, LayerProfile, ModelSpec


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "label", "created_by", "created_at", "expires_at", "revoked_at",
                    "uses", "max_uses")
    list_filter = ("revoked_at",)
    search_fields = ("label", "prefix")
    readonly_fields = ("prefix", "token_digest", "uses")


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ("name", "uid", "status", "last_heartbeat_at", "speed", "memory_bytes",
                    "bandwidth_bps", "latency_s")
    list_filter = ("status",)
    search_fields = ("name", "uid")
    readonly_fields = ("uid", "key_hash", "enrolled_at", "retired_at", "enrollment_token")


@admin.register(ModelSpec)
class ModelSpecAdmin(admin.ModelAdmin):
    list_display = ("model", "dataset", "batch_size", "created_at")
    search_fields = ("model", "dataset")


@admin.register(LayerProfile)
class LayerProfileAdmin(admin.ModelAdmin):
    list_display = ("device", "model_spec", "num_layers", "forward_s", "backward_s",
                    "measured_at")
    list_filter = ("model_spec",)
    list_select_related = ("device", "model_spec")


@admin.register(DeviceLink)
class DeviceLinkAdmin(admin.ModelAdmin):
    list_display = ("source", "target", "bandwidth_bps", "latency_s", "measured_at")
    list_select_related = ("source", "target")
