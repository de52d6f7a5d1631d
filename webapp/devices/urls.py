from django.urls import path

from webapp.devices import apis

urlpatterns = [
    path("enrollment-tokens/", apis.TokenListCreateApi.as_view(), name="token-list"),
    path("enrollment-tokens/<int:token_id>/revoke/", apis.TokenRevokeApi.as_view(),
         name="token-revoke"),
    path("devices/", apis.DeviceListApi.as_view(), name="device-list"),
    path("devices/<int:device_id>/", apis.DeviceDetailApi.as_view(), name="device-detail"),
    path("devices/<int:device_id>/retire/", apis.DeviceRetireApi.as_view(),
         name="device-retire"),
    path("devices/<int:device_id>/profile/", apis.DeviceProfileRequestApi.as_view(),
         name="device-profile"),
    path("devices/<int:device_id>/stop-agent/", apis.DeviceStopAgentApi.as_view(),
         name="device-stop-agent"),
    path("devices/<int:device_id>/restart-agent/", apis.DeviceRestartAgentApi.as_view(),
         name="device-restart-agent"),
    path("devices/<int:device_id>/emulate/", apis.DeviceEmulateApi.as_view(),
         name="device-emulate"),
    path("links/", apis.DeviceLinksApi.as_view(), name="device-links"),
    path("model-specs/", apis.ModelSpecListCreateApi.as_view(), name="model-spec-list"),
    path("profiles/", apis.ProfileListApi.as_view(), name="profile-list"),
    path("profiles/<int:profile_id>/", apis.ProfileDetailApi.as_view(), name="profile-detail"),
    path("agent/enrol/", apis.EnrolApi.as_view(), name="agent-enrol"),
    path("agent/me/", apis.AgentMeApi.as_view(), name="agent-me"),
    path("agent/heartbeat/", apis.AgentHeartbeatApi.as_view(), name="agent-heartbeat"),
    path("agent/profiles/", apis.AgentProfileUploadApi.as_view(), name="agent-profile-upload"),
]
