"""REST endpoints for devices: users manage enrolment tokens, devices and model specs and read
profiles (session); agents enrol, send heartbeats and upload profiles (device key).

Any logged-in user reads and renames; only staff users (webapp.common.permissions) create and
revoke enrolment tokens, retire devices, stop agents and change their emulation."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.protocol import HARDWARE, ProtocolError
from webapp.common import fields
from webapp.common.api import get_or_404, validated
from webapp.common.permissions import STAFF, STAFF_WRITES
from webapp.common.schema import STAFF as STAFF_ONLY
from webapp.common.schema import errors
from webapp.devices import selectors, services, supervision
from webapp.devices.auth import DeviceKeyAuthentication, IsDevice
from webapp.devices.models import Device, ModelSpec

MAX_TOKEN_TTL_S = 30 * 24 * 3600
MAX_BYTES = 2**62
MAX_ID = 2**63 - 1  # the primary keys' range (BigAutoField): a larger id overflows the query


class TokenOutput(serializers.Serializer):
    id = serializers.IntegerField()
    label = serializers.CharField()
    prefix = serializers.CharField()
    created_by = serializers.CharField(source="created_by.username", default=None,
                                       allow_null=True,
                                       help_text="null when made without a user, or the user "
                                                 "is deleted")
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    revoked_at = serializers.DateTimeField(allow_null=True, help_text="null unless revoked")
    max_uses = serializers.IntegerField()
    uses = serializers.IntegerField()


class DeviceOutput(serializers.Serializer):
    id = serializers.IntegerField()
    uid = serializers.CharField()
    name = serializers.CharField()
    status = serializers.CharField()
    last_heartbeat_at = serializers.DateTimeField(allow_null=True,
                                                  help_text="null before its first heartbeat")
    hardware = serializers.JSONField()
    resources = serializers.JSONField(
        help_text="the compute resources its agent emulates: [{kind, speed, backward_speed}]")
    speed = serializers.FloatField()
    memory_bytes = serializers.IntegerField()
    bandwidth_bps = serializers.FloatField()
    uplink_bps = serializers.FloatField(allow_null=True,
                                        help_text="null: as bandwidth_bps (a symmetric link)")
    downlink_bps = serializers.FloatField(allow_null=True,
                                          help_text="null: as bandwidth_bps (a symmetric link)")
    latency_s = serializers.FloatField()
    overhead_s = serializers.FloatField()
    message_s = serializers.FloatField()
    enrolled_at = serializers.DateTimeField()
    retired_at = serializers.DateTimeField(allow_null=True, help_text="null unless retired")


class ModelSpecOutput(serializers.Serializer):
    id = serializers.IntegerField()
    model = serializers.CharField()
    dataset = serializers.CharField()
    batch_size = serializers.IntegerField()


class ProfileOutput(serializers.Serializer):
    id = serializers.IntegerField()
    device = serializers.IntegerField(source="device_id")
    device_uid = serializers.CharField(source="device.uid")
    model_spec = serializers.IntegerField(source="model_spec_id")
    num_layers = serializers.IntegerField()
    forward_s = serializers.FloatField()
    backward_s = serializers.FloatField()
    measured_at = serializers.DateTimeField()
    overhead_s = serializers.FloatField(
        allow_null=True, help_text="the fixed time a micro-batch of the model cost a stage on "
                                   "the device beyond its layers and its sends, as its runs "
                                   "measured it (a weighted mean)")
    message_s = serializers.FloatField(
        allow_null=True, help_text="the time a stage of the model on the device spent on each "
                                   "message it sent, as its runs measured it (a weighted mean)")
    pass_overhead_s = serializers.FloatField(
        allow_null=True, help_text="the part of overhead_s spent inside the stage's forward, "
                                   "backward and update passes, as its runs measured it (a "
                                   "weighted mean)")


class ProfileDetailOutput(ProfileOutput):
    document = serializers.JSONField()


# --------------------------------------------------------------------------- enrolment tokens


class TokenListCreateApi(APIView):
    permission_classes = STAFF_WRITES
    staff_action = "create enrolment tokens"

    class TokenCreateInput(serializers.Serializer):
        label = fields.CharField(max_length=100, required=False, allow_blank=True, default="")
        max_uses = fields.IntegerField(min_value=1, max_value=1000, required=False, default=1)
        expires_in_s = fields.IntegerField(min_value=60, max_value=MAX_TOKEN_TTL_S,
                                           required=False)

    class CreatedOutput(TokenOutput):
        token = serializers.CharField(help_text="the secret: shown once, never again")

    @extend_schema(responses={200: TokenOutput(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        return Response(TokenOutput(selectors.enrollment_token_list(), many=True).data)

    @extend_schema(request=TokenCreateInput,
                   responses={201: CreatedOutput, **errors(400, 401, 403, forbidden=STAFF_ONLY)},
                   description="Staff only (403); any logged-in user lists the tokens.")
    def post(self, request: Request) -> Response:
        data = validated(self.TokenCreateInput, request)
        token, secret = services.enrollment_token_create(created_by=request.user, **data)
        token.token = secret
        return Response(self.CreatedOutput(token).data, status=status.HTTP_201_CREATED)


class TokenRevokeApi(APIView):
    permission_classes = STAFF
    staff_action = "revoke enrolment tokens"

    @extend_schema(request=None, description="Staff only (403).", responses={
        200: TokenOutput, **errors(401, 403, 404, forbidden=STAFF_ONLY)})
    def post(self, request: Request, token_id: int) -> Response:
        token = get_or_404(selectors.enrollment_token_list(), token_id, what="enrolment token")
        return Response(TokenOutput(services.enrollment_token_revoke(token=token)).data)


# --------------------------------------------------------------------------- devices (users)


class DeviceListApi(APIView):
    class DeviceFilter(serializers.Serializer):
        status = serializers.ChoiceField(choices=Device.Status.choices, required=False)

    @extend_schema(parameters=[DeviceFilter],
                   responses={200: DeviceOutput(many=True), **errors(400, 401)})
    def get(self, request: Request) -> Response:
        filters = self.DeviceFilter(data=request.query_params)
        filters.is_valid(raise_exception=True)
        devices = selectors.device_list(**filters.validated_data)
        return Response(DeviceOutput(devices, many=True).data)


class DeviceDetailApi(APIView):
    class DeviceRenameInput(serializers.Serializer):
        name = fields.CharField(max_length=100)

    @extend_schema(responses={200: DeviceOutput, **errors(401, 404)})
    def get(self, request: Request, device_id: int) -> Response:
        device = get_or_404(selectors.device_list(), device_id, what="device")
        return Response(DeviceOutput(device).data)

    @extend_schema(request=DeviceRenameInput,
                   responses={200: DeviceOutput, **errors(400, 401, 403, 404)})
    def patch(self, request: Request, device_id: int) -> Response:
        device = get_or_404(selectors.device_list(), device_id, what="device")
        data = validated(self.DeviceRenameInput, request)
        return Response(DeviceOutput(services.device_rename(device=device, **data)).data)


class DeviceRetireApi(APIView):
    permission_classes = STAFF
    staff_action = "retire devices"

    @extend_schema(request=None,
                   responses={200: DeviceOutput, **errors(401, 403, 404, forbidden=STAFF_ONLY)},
                   description="Take the device out of service: its key stops working and its "
                               "agent's connection is closed. Staff only (403).")
    def post(self, request: Request, device_id: int) -> Response:
        device = get_or_404(selectors.device_list(), device_id, what="device")
        return Response(DeviceOutput(services.device_retire(device=device)).data)


class DeviceProfileRequestApi(APIView):
    class ProfileRequestInput(serializers.Serializer):
        model_spec = serializers.PrimaryKeyRelatedField(queryset=ModelSpec.objects.all())

    @extend_schema(request=ProfileRequestInput, responses={
        202: inline_serializer("ProfileRequested", {
            "command": serializers.CharField(help_text="the id of the command sent"),
            "device": serializers.CharField(help_text="the device's uid"),
            "model_spec": serializers.IntegerField()}),
        **errors(400, 401, 403, 404, 409,
                 conflict="The device is retired, or no agent of it is connected.")})
    def post(self, request: Request, device_id: int) -> Response:
        device = get_or_404(selectors.device_list(), device_id, what="device")
        data = validated(self.ProfileRequestInput, request)
        command = services.device_profile_request(device=device, model_spec=data["model_spec"])
        return Response({"command": command.id, "device": device.uid,
                         "model_spec": data["model_spec"].pk}, status=status.HTTP_202_ACCEPTED)


class DeviceStopAgentApi(APIView):
    permission_classes = STAFF
    staff_action = "stop a device's agent"

    class StopAgentOutput(serializers.Serializer):
        command = serializers.CharField(help_text="the id of the command sent")
        device = serializers.CharField(help_text="the device's uid")
        sent = serializers.CharField(help_text='the command: "exit"')

    @extend_schema(request=None, responses={202: StopAgentOutput, **errors(
        401, 403, 404, 409, forbidden=STAFF_ONLY,
        conflict="The device is retired, or no agent of it is connected.")},
                   description="Fault injection: the device's agent exits at once, as if "
                               "killed. 409 when no agent is connected. Staff only (403).")
    def post(self, request: Request, device_id: int) -> Response:
        device = get_or_404(selectors.device_list(), device_id, what="device")
        command = services.device_agent_stop(device=device)
        return Response(self.StopAgentOutput({"command": command.id, "device": device.uid,
                                              "sent": command.NAME}).data,
                        status=status.HTTP_202_ACCEPTED)


class DeviceRestartAgentApi(APIView):
    permission_classes = STAFF
    staff_action = "restart a device's agent"

    class RestartAgentOutput(serializers.Serializer):
        device = serializers.CharField(help_text="the device's uid")
        supervisor = serializers.CharField(help_text="who starts the agent again")
        requested_at = serializers.DateTimeField(source="restart_requested_at")

    @extend_schema(request=None, responses={202: RestartAgentOutput, **errors(
        401, 403, 404, 409, forbidden=STAFF_ONLY,
        conflict="The device is retired, its agent is connected, or nothing on this server "
                 "can start it (no supervisor: its agent runs on the device).")},
                   description="Ask the supervisor that started the device's agent (the "
                               "demo's local testbed) to start it again, after *Stop agent* "
                               "say; the device rejoins a run at its next re-partition. "
                               "Staff only (403).")
    def post(self, request: Request, device_id: int) -> Response:
        device = get_or_404(selectors.device_list(), device_id, what="device")
        requested = supervision.device_agent_restart(device=device)
        return Response(self.RestartAgentOutput({
            "device": device.uid, "supervisor": requested.supervisor,
            "restart_requested_at": requested.restart_requested_at}).data,
            status=status.HTTP_202_ACCEPTED)


class DeviceEmulateApi(APIView):
    permission_classes = STAFF
    staff_action = "change a device's emulation"

    class EmulateInput(serializers.Serializer):
        slowdown = serializers.FloatField(min_value=1.0, max_value=1000.0,
                                          help_text="compute this many times slower than now "
                                                    "(1: the machine's own speed)")

    @extend_schema(request=EmulateInput, responses={
        202: DeviceStopAgentApi.StopAgentOutput,
        **errors(400, 401, 403, 404, 409, forbidden=STAFF_ONLY,
                 conflict="No agent of the device is connected.")},
                   description="Emulation: the device's agent computes `slowdown` times slower "
                               "from now on (as `--slowdown` does at start). 409 when no agent "
                               "is connected. Staff only (403).")
    def post(self, request: Request, device_id: int) -> Response:
        device = get_or_404(selectors.device_list(), device_id, what="device")
        data = validated(self.EmulateInput, request)
        command = services.device_emulate(device=device, slowdown=data["slowdown"])
        return Response(DeviceStopAgentApi.StopAgentOutput(
            {"command": command.id, "device": device.uid, "sent": command.NAME}).data,
            status=status.HTTP_202_ACCEPTED)


class LinkOutput(serializers.Serializer):
    source = serializers.CharField(source="source.uid")
    target = serializers.CharField(source="target.uid")
    bandwidth_bps = serializers.FloatField()
    latency_s = serializers.FloatField()
    measured_at = serializers.DateTimeField()


class DeviceLinksApi(APIView):
    class MeasureInput(serializers.Serializer):
        devices = serializers.PrimaryKeyRelatedField(queryset=Device.objects.all(), many=True,
                                                     allow_empty=False)

    @extend_schema(responses={200: LinkOutput(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        """Every measured link (as its source measured it)."""
        return Response(LinkOutput(selectors.device_link_list(), many=True).data)

    @extend_schema(request=MeasureInput, responses={
        202: inline_serializer("LinksMeasuring", {"devices": serializers.ListField(
            child=serializers.CharField(), help_text="the uids of the devices asked")}),
        **errors(400, 401, 403, 409,
                 conflict="Fewer than two of the devices have an agent connected.")})
    def post(self, request: Request) -> Response:
        """Ask the devices' agents to measure the links among them."""
        data = validated(self.MeasureInput, request)
        asked = services.device_links_measure(devices=data["devices"])
        return Response({"devices": asked}, status=status.HTTP_202_ACCEPTED)


# --------------------------------------------------------------------------- model specs, profiles


class ModelSpecListCreateApi(APIView):
    class ModelSpecInput(serializers.Serializer):
        model = fields.CharField(max_length=64)
        dataset = fields.CharField(max_length=64)
        batch_size = fields.IntegerField(min_value=1, max_value=65536)

    @extend_schema(responses={200: ModelSpecOutput(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        return Response(ModelSpecOutput(selectors.model_spec_list(), many=True).data)

    @extend_schema(request=ModelSpecInput, responses={200: ModelSpecOutput,
                                                       201: ModelSpecOutput,
                                                       **errors(400, 401, 403)})
    def post(self, request: Request) -> Response:
        spec, created = services.model_spec_get_or_create(
            **validated(self.ModelSpecInput, request))
        return Response(ModelSpecOutput(spec).data,
                        status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class ProfileListApi(APIView):
    class ProfileFilter(serializers.Serializer):
        device = serializers.IntegerField(required=False, source="device_id", min_value=1,
                                          max_value=MAX_ID, help_text="a device's id")
        model_spec = serializers.IntegerField(required=False, source="model_spec_id",
                                              min_value=1, max_value=MAX_ID,
                                              help_text="a model spec's id")

    @extend_schema(parameters=[ProfileFilter],
                   responses={200: ProfileOutput(many=True), **errors(400, 401)})
    def get(self, request: Request) -> Response:
        filters = self.ProfileFilter(data=request.query_params)
        filters.is_valid(raise_exception=True)
        profiles = selectors.layer_profile_list(**filters.validated_data)
        return Response(ProfileOutput(profiles, many=True).data)


class ProfileDetailApi(APIView):
    @extend_schema(responses={200: ProfileDetailOutput, **errors(401, 404)})
    def get(self, request: Request, profile_id: int) -> Response:
        profile = get_or_404(selectors.layer_profile_list(), profile_id, what="profile")
        return Response(ProfileDetailOutput(profile).data)


# --------------------------------------------------------------------------- agents


class AgentApi(APIView):
    """An endpoint agents call with their device key."""

    authentication_classes = (DeviceKeyAuthentication,)
    permission_classes = (IsDevice,)


class EnrolApi(APIView):
    authentication_classes = ()
    permission_classes = (AllowAny,)

    class EnrolInput(serializers.Serializer):
        token = fields.CharField(max_length=200)
        name = fields.CharField(max_length=100)
        hardware = fields.ObjectField(required=False, default=dict)
        memory_bytes = fields.IntegerField(min_value=1, max_value=MAX_BYTES)
        bandwidth_bps = fields.FloatField(min_value=1.0)
        latency_s = fields.FloatField(min_value=0.0, max_value=60.0, required=False, default=0.0)
        uplink_bps = fields.FloatField(min_value=1.0, required=False, allow_null=True,
                                       default=None)
        downlink_bps = fields.FloatField(min_value=1.0, required=False, allow_null=True,
                                         default=None)
        speed = fields.FloatField(min_value=1e-9, required=False, default=1.0)

        def validate_hardware(self, value: dict[str, Any]) -> dict[str, Any]:
            """As bounded as hello's (a 900 KB description was stored as it came)."""
            try:
                return dict(HARDWARE(value, "hardware"))
            except ProtocolError as exc:
                raise serializers.ValidationError(exc.reason) from None

    class EnrolOutput(serializers.Serializer):
        id = serializers.IntegerField()
        uid = serializers.CharField()
        name = serializers.CharField()
        key = serializers.CharField(help_text="the device key: shown once, never again")
        authorization = serializers.CharField(help_text="the header value to send")

    @extend_schema(request=EnrolInput, auth=[], responses={201: EnrolOutput, **errors(
        400, invalid="Invalid input, or the token is unknown, expired, revoked or used up "
                     "(the `token` field says which).")})
    def post(self, request: Request) -> Response:
        device, key = services.device_enrol(**validated(self.EnrolInput, request))
        return Response(self.EnrolOutput({"id": device.pk, "uid": device.uid, "name": device.name,
                                     "key": key, "authorization": f"Device {device.uid}:{key}"}
                                    ).data, status=status.HTTP_201_CREATED)


class AgentMeApi(AgentApi):
    @extend_schema(responses={200: DeviceOutput, **errors(401)})
    def get(self, request: Request) -> Response:
        return Response(DeviceOutput(request.auth).data)


class AgentHeartbeatApi(AgentApi):
    class HeartbeatInput(serializers.Serializer):
        status = serializers.ChoiceField(choices=[Device.Status.ONLINE, Device.Status.BUSY],
                                         required=False, default=Device.Status.ONLINE)

    @extend_schema(request=HeartbeatInput, responses={200: DeviceOutput, **errors(400, 401)})
    def post(self, request: Request) -> Response:
        device = services.device_heartbeat(device=request.auth,
                                           **validated(self.HeartbeatInput, request))
        return Response(DeviceOutput(device).data)


class AgentProfileUploadApi(AgentApi):
    class ProfileUploadInput(serializers.Serializer):
        model_spec = serializers.PrimaryKeyRelatedField(queryset=selectors.model_spec_list())
        profile = fields.ObjectField(help_text="a model profile (docs/architecture.md) measured "
                                               "on this device")

    @extend_schema(request=ProfileUploadInput,
                   responses={201: ProfileOutput, **errors(400, 401)})
    def post(self, request: Request) -> Response:
        data = validated(self.ProfileUploadInput, request)
        profile = services.layer_profile_upload(device=request.auth,
                                                model_spec=data["model_spec"],
                                                document=data["profile"])
        return Response(ProfileOutput(profile).data, status=status.HTTP_201_CREATED)

