"""REST endpoints for runs: users create, plan, start, pause and stop runs and compare plans
(session); agents read the runs they belong to and report their events (device key)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpResponse, HttpResponseBase
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import PermissionDenied
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.formats import SCHEDULES
from webapp.common import fields
from webapp.common.api import get_or_404, validated
from webapp.common.exceptions import InvalidInput
from webapp.common.schema import errors, json_errors
from webapp.devices.apis import AgentApi
from webapp.devices.selectors import device_list, model_spec_list
from webapp.runs import replicas, selectors, services
from webapp.runs.models import (
    AGGREGATE_EVERY_MAX,
    LR_MAX,
    MOMENTUM_MAX,
    RECOVERY_POLICIES,
    RUN_DEFAULTS,
    MetricPoint,
    Run,
)
from webapp.runs.serializers import PlanDetailOutput, RunOutput
from webapp.runs.services.split_rounds import split_round_stored

MAX_EVENTS = 20000


def _run(run_id: int) -> Run:
    return get_or_404(selectors.run_list(), run_id, what="run")


class RunListCreateApi(APIView):
    class RunFilter(serializers.Serializer):
        state = serializers.ChoiceField(choices=Run.State.choices, required=False)

    class RunCreateInput(serializers.Serializer):
        name = fields.CharField(max_length=100)
        model_spec = serializers.PrimaryKeyRelatedField(queryset=model_spec_list())
        devices = serializers.ListField(
            child=serializers.PrimaryKeyRelatedField(queryset=device_list()),
            allow_empty=False, max_length=64)
        algorithms = serializers.ListField(child=fields.CharField(max_length=32),
                                           allow_empty=False, max_length=16)
        schedule = serializers.ChoiceField(choices=SCHEDULES, required=False,
                                           default=RUN_DEFAULTS["schedule"])
        microbatches = fields.IntegerField(min_value=1, max_value=1024, required=False,
                                           default=RUN_DEFAULTS["microbatches"])
        batches = fields.IntegerField(min_value=1, max_value=10**9, required=False,
                                      default=RUN_DEFAULTS["batches"])
        epochs = fields.IntegerField(min_value=1, max_value=10**6, required=False,
                                     default=RUN_DEFAULTS["epochs"])
        chain_every = fields.IntegerField(
            min_value=0, max_value=10**9, required=False, default=RUN_DEFAULTS["chain_every"],
            help_text="batches between chain replicas (each stage's weights to the next "
                      "stage's device); 0 = off")
        global_every = fields.IntegerField(
            min_value=0, max_value=10**9, required=False, default=RUN_DEFAULTS["global_every"],
            help_text="batches between replicas uploaded to the server; 0 = off")
        repartition_after = fields.IntegerField(
            min_value=1, max_value=10**9, required=False,
            default=RUN_DEFAULTS["repartition_after"],
            help_text="batches before the first dynamic re-partition check")
        repartition_every = fields.IntegerField(
            min_value=0, max_value=10**9, required=False,
            default=RUN_DEFAULTS["repartition_every"],
            help_text="batches between dynamic re-partition checks; 0 = off")
        recovery_policy = serializers.ChoiceField(
            choices=RECOVERY_POLICIES, required=False, default=RUN_DEFAULTS["recovery_policy"],
            help_text="after a failure: replan (re-plan the survivors with the run's planner) "
                      "or respipe (the baseline: the failed stage's successor takes its layers)")
        lr = fields.FloatField(min_value=1e-9, max_value=LR_MAX, required=False,
                               default=RUN_DEFAULTS["lr"],
                               help_text="SGD learning rate of every stage")
        momentum = fields.FloatField(
            min_value=0.0, max_value=MOMENTUM_MAX, required=False,
            default=RUN_DEFAULTS["momentum"],
            help_text="SGD momentum; its buffers are replicated and restored with the weights")
        vertical_sync = fields.BooleanField(
            required=False, default=RUN_DEFAULTS["vertical_sync"],
            help_text="1F1B: every stage forwards and backwards micro-batch m with the weight "
                      "version stage 0 used for it (PipeDream's vertical sync); ignored under "
                      "gpipe and 1f1b-sync, which flush every batch and have no stale weights")
        aggregate_every = fields.IntegerField(
            min_value=0, max_value=AGGREGATE_EVERY_MAX, required=False,
            default=RUN_DEFAULTS["aggregate_every"],
            help_text="1F1B: every aggregate_every x its in-flight depth D updates, each stage "
                      "replaces its weights by the average of its last D weight versions "
                      "(FTPipeHD's weight aggregation); 0 = off, and must be 0 under gpipe and "
                      "1f1b-sync")

    @extend_schema(parameters=[RunFilter],
                   responses={200: RunOutput(many=True), **errors(400, 401)})
    def get(self, request: Request) -> Response:
        filters = self.RunFilter(data=request.query_params)
        filters.is_valid(raise_exception=True)
        return Response(RunOutput(selectors.run_list(**filters.validated_data), many=True).data)

    @extend_schema(request=RunCreateInput, responses={201: RunOutput, **errors(400, 401, 403)})
    def post(self, request: Request) -> Response:
        run = services.run_create(**validated(self.RunCreateInput, request),
                                  created_by=request.user)
        return Response(RunOutput(_run(run.pk)).data, status=status.HTTP_201_CREATED)


class RunDetailApi(APIView):
    @extend_schema(responses={200: RunOutput, **errors(401, 404)})
    def get(self, request: Request, run_id: int) -> Response:
        return Response(RunOutput(_run(run_id)).data)


class RunPlanApi(APIView):
    class RunPlanInput(serializers.Serializer):
        algorithms = serializers.ListField(child=fields.CharField(max_length=32),
                                           allow_empty=False, max_length=16, required=False)

    @extend_schema(request=RunPlanInput, responses={202: RunOutput, **errors(
        400, 401, 403, 404, 409, conflict="The run's state does not allow planning (a run "
                                          "starting, running or finished, say).")})
    def post(self, request: Request, run_id: int) -> Response:
        run = services.run_plan(run=_run(run_id), **validated(self.RunPlanInput, request))
        return Response(RunOutput(_run(run.pk)).data, status=status.HTTP_202_ACCEPTED)


class RunStartApi(APIView):
    class RunStartInput(serializers.Serializer):
        plan = fields.IntegerField(min_value=1, required=False,
                                   help_text="the plan to start with (default: the best)")

    @extend_schema(request=RunStartInput, responses={200: RunOutput, **errors(
        400, 401, 403, 404, 409, invalid="Invalid input, or no plan to start: `plan` is not "
                                         "a finished plan of the run that fits in memory.",
        conflict="The run's state does not allow starting it (not planned or paused).")})
    def post(self, request: Request, run_id: int) -> Response:
        run = _run(run_id)
        data = validated(self.RunStartInput, request)
        plan = None
        if "plan" in data:
            plan = selectors.plan_list(run=run).filter(pk=data["plan"]).first()
            if plan is None:
                raise InvalidInput("plan", f"plan {data['plan']} is not a plan of run {run.pk}")
        return Response(RunOutput(services.run_start(run=run, plan=plan)).data)


class RunPauseApi(APIView):
    @extend_schema(request=None, responses={200: RunOutput, **errors(
        401, 403, 404, 409, conflict="The run is not running (nor recovering).")})
    def post(self, request: Request, run_id: int) -> Response:
        return Response(RunOutput(services.run_pause(run=_run(run_id))).data)


class RunStopApi(APIView):
    @extend_schema(request=None, responses={200: RunOutput, **errors(
        401, 403, 404, 409, conflict="The run has ended already (finished, failed or "
                                     "cancelled).")})
    def post(self, request: Request, run_id: int) -> Response:
        return Response(RunOutput(services.run_stop(run=_run(run_id))).data)


class PlanListApi(APIView):
    @extend_schema(responses={200: PlanDetailOutput(many=True), **errors(401, 404)})
    def get(self, request: Request, run_id: int) -> Response:
        plans = selectors.plan_list(run=_run(run_id))
        return Response(PlanDetailOutput(plans, many=True).data)


class PlanCompareApi(APIView):
    @extend_schema(responses={200: inline_serializer("PlanComparison", {
        "best": serializers.IntegerField(allow_null=True),
        "reason": serializers.CharField(),
        "rows": serializers.ListField(child=serializers.DictField()),
    }), **errors(401, 404)})
    def get(self, request: Request, run_id: int) -> Response:
        return Response(selectors.plan_compare(run=_run(run_id)))


class RunTimelineApi(APIView):
    class TimelineQuery(serializers.Serializer):
        # query parameters are text: DRF's own fields parse them
        start = serializers.FloatField(min_value=0.0, required=False,
                                       help_text="seconds since the run started (default 0)")
        end = serializers.FloatField(min_value=0.0, required=False,
                                     help_text="default: the end of the run's newest event")
        max_bars = serializers.IntegerField(
            min_value=1, max_value=selectors.TIMELINE_MAX_BARS, required=False, default=600,
            help_text="at most this many bars per device and lane when downsampled")
        max_events = serializers.IntegerField(
            min_value=0, max_value=selectors.TIMELINE_MAX_EVENTS, required=False,
            default=selectors.TIMELINE_EXACT_EVENTS,
            help_text="the events themselves when at most this many overlap the span")

        def validate(self, data: dict) -> dict:
            start, end = data.get("start", 0.0), data.get("end")
            if end is not None and end <= start:
                raise serializers.ValidationError({"end": f"must be after start ({start:g})"})
            return data

    @extend_schema(parameters=[TimelineQuery], responses={200: inline_serializer("RunTimeline", {
        "run": serializers.IntegerField(),
        "start_s": serializers.FloatField(), "end_s": serializers.FloatField(),
        "newest_s": serializers.FloatField(allow_null=True,
                                           help_text="the end of the run's newest event"),
        "events_in_span": serializers.IntegerField(),
        "exact": serializers.BooleanField(help_text="events (true) or bars (false)"),
        "bin_s": serializers.FloatField(help_text="the bars' resolution: span / max_bars"),
        "events": serializers.ListField(child=serializers.DictField(),
                                        help_text="timeline events (docs/architecture.md)"),
        "bars": serializers.ListField(
            child=serializers.DictField(),
            help_text="device, lane (compute, sync, comm), kind (most busy seconds), start, "
                      "end, count (events merged), busy_s, microbatches [first, last]"),
    }), **errors(400, 401, 404)})
    def get(self, request: Request, run_id: int) -> Response:
        """The run's timeline over a span (default: the whole run): its events when few
        enough, else downsampled to at most max_bars bars per device and lane."""
        run = _run(run_id)
        query = self.TimelineQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        data = query.validated_data
        return Response(selectors.run_timeline_span(
            run=run, start_s=data.get("start"), end_s=data.get("end"),
            max_bars=data["max_bars"], max_events=data["max_events"]))


# --------------------------------------------------------------------------- agents


def _member_run(request: Request, run_id: int) -> Run:
    # the run alone, not run_list()'s prefetched plans and devices: an agent uploads a global
    # replica every few batches (a quarter of the web process's time went to that query)
    run = get_or_404(Run.objects.all(), run_id, what="run")
    if not run.run_devices.filter(device=request.auth).exists():
        raise PermissionDenied(f"device {request.auth.uid} is not a device of run {run.pk}")
    return run


# what an agent's request about a run may be refused for
NOT_A_MEMBER = "The device is not one of the run's devices."


class AgentRunListApi(AgentApi):
    @extend_schema(responses={200: RunOutput(many=True), **errors(401)})
    def get(self, request: Request) -> Response:
        return Response(RunOutput(selectors.run_list(device=request.auth), many=True).data)


class AgentRunDetailApi(AgentApi):
    class AgentRunOutput(RunOutput):
        plan = PlanDetailOutput(source="chosen_plan", allow_null=True)

    @extend_schema(responses={200: AgentRunOutput, **errors(401, 403, 404,
                                                            forbidden=NOT_A_MEMBER)})
    def get(self, request: Request, run_id: int) -> Response:
        return Response(self.AgentRunOutput(_member_run(request, run_id)).data)


class AgentRunEventsApi(AgentApi):
    class MetricInput(serializers.Serializer):
        at = fields.FloatField(min_value=0.0)
        kind = serializers.ChoiceField(choices=MetricPoint.Kind.choices)
        value = fields.FloatField()
        device = fields.CharField(max_length=64, required=False, allow_blank=True, default="")

    class EventsInput(serializers.Serializer):
        timeline = serializers.ListField(child=fields.ObjectField(), required=False,
                                         default=list, max_length=MAX_EVENTS,
                                         help_text="timeline events (shared schema)")
        faults = serializers.ListField(child=fields.ObjectField(), required=False,
                                       default=list, max_length=MAX_EVENTS,
                                       help_text="fault and control events (shared schema)")
        metrics = serializers.ListField(required=False, default=list, max_length=MAX_EVENTS)

        def validate_metrics(self, value: list[object]) -> list[dict[str, object]]:
            points = AgentRunEventsApi.MetricInput(data=value, many=True)
            points.is_valid(raise_exception=True)
            return [dict(p) for p in points.validated_data]

    @extend_schema(request=EventsInput, responses={201: inline_serializer(
        "EventsStored", {"timeline": serializers.IntegerField(),
                         "faults": serializers.IntegerField(),
                         "metrics": serializers.IntegerField(),
                         "refused": serializers.ListField(
                             child=serializers.DictField(), help_text=(
                                 "metric points not kept: {field, reason} for each of the "
                                 "first 16"))}),
                   **errors(400, 401, 403, 404, 409, forbidden=NOT_A_MEMBER,
                            conflict="The run is not active: it takes events only while it is "
                                     "starting, running, recovering or paused.")})
    def post(self, request: Request, run_id: int) -> Response:
        run = _member_run(request, run_id)
        data = validated(self.EventsInput, request)
        stored = services.run_events_store(run=run, device=request.auth, **data)
        return Response(stored, status=status.HTTP_201_CREATED)



class OctetStreamRenderer(BaseRenderer):
    """Lets an agent ask for ``Accept: application/octet-stream`` (else a 406): the replica
    itself is sent as an HttpResponse, errors as JSON (AgentRunReplicasApi.finalize_response)."""

    media_type = "application/octet-stream"
    format = "bin"
    charset = None
    render_style = "binary"

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: dict[str, Any] | None = None) -> bytes:
        if isinstance(data, bytes):
            return data
        rendered: bytes = JSONRenderer().render(data)
        return rendered


REPLICA_MISSING = inline_serializer("ReplicaMissing", {
    "detail": serializers.CharField(),
    "layer": serializers.IntegerField(required=False,
                                      help_text="the layer no replica holds, when that is why")})
# the renderers' ?format= override is of no use to agents
NO_FORMAT = OpenApiParameter("format", exclude=True)


class AgentRunReplicasApi(AgentApi):
    """Global replicas (webapp.runs.replicas): a staged device uploads its stage's weights
    (safetensors, the raw request body), a device restoring a stage downloads the layers the
    recovery told it to take from the server."""

    renderer_classes = (JSONRenderer, OctetStreamRenderer)

    class ReplicaQuery(serializers.Serializer):
        first = serializers.IntegerField(min_value=0, max_value=replicas.MAX_LAYER,
                                         help_text="first layer (inclusive)")
        last = serializers.IntegerField(min_value=0, max_value=replicas.MAX_LAYER,
                                        help_text="last layer (inclusive)")
        applied = serializers.IntegerField(
            min_value=0, max_value=replicas.MAX_LAYER,
            help_text="micro-batches whose updates the weights contain")

    def _query(self, request: Request) -> dict[str, int]:
        query = self.ReplicaQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        return dict(query.validated_data)

    def finalize_response(self, request: Request, response: HttpResponseBase, *args: Any,
                          **kwargs: Any) -> HttpResponseBase:
        if isinstance(response, Response):  # an error: JSON whatever the agent accepts
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        parameters=[ReplicaQuery, NO_FORMAT],
        request={"application/octet-stream": OpenApiTypes.BINARY},
        responses={(201, "application/json"): inline_serializer("ReplicaStored", {
            "id": serializers.IntegerField(), "bytes": serializers.IntegerField(),
            "sha256": serializers.CharField()}),
            **errors(400, 401, 403, 404, 409,
                     forbidden=f"{NOT_A_MEMBER[:-1]}, or the layers are not all of its stage "
                               "in the run's current plan (the detail names the field).",
                          conflict="The run is not active, or has no plan and its model's "
                                   "layers are unknown.")},
        description="Upload the weights of layers first..last at applied (safetensors, tensor "
                    "names '<layer index>.<name>', at most REPLICA_MAX_BYTES); the server "
                    "keeps the two newest applied of each layer range. Only layers of the "
                    "device's own stage in the run's current plan (403 naming the field "
                    "otherwise), only while the run is starting, running, recovering or "
                    "paused (409), and never past the model's last layer (400 on `last`).")
    def put(self, request: Request, run_id: int) -> Response:
        run = _member_run(request, run_id)
        query = self._query(request)
        data = _body(request, limit=settings.REPLICA_MAX_BYTES)
        replica = replicas.replica_store(run=run, device=request.auth, data=data, **query)
        split_round_stored(run=run, applied=replica.applied)
        return Response({"id": replica.pk, "bytes": replica.bytes, "sha256": replica.sha256},
                        status=status.HTTP_201_CREATED)

    @extend_schema(
        parameters=[ReplicaQuery, NO_FORMAT],
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY,
                   (404, "application/json"): OpenApiResponse(
                       REPLICA_MISSING, description="The run does not exist, or no replica "
                                                    "holds a layer: the detail names it, "
                                                    "`layer` is its index."),
                   **json_errors(400, 401, 403, forbidden=NOT_A_MEMBER)},
        description="The server's replicas of layers first..last at exactly applied, merged "
                    "into one safetensors file (metadata run, first, last, applied); a range "
                    "past the model's last layer is a 400 on `last`.")
    def get(self, request: Request, run_id: int) -> HttpResponseBase:
        run = _member_run(request, run_id)
        try:
            blob = replicas.replica_read(run=run, **self._query(request))
        except replicas.ReplicaMissing as missing:
            return Response({"detail": missing.message, "layer": missing.layer},
                            status=status.HTTP_404_NOT_FOUND)
        return HttpResponse(blob, content_type="application/octet-stream")


def _body(request: Request, *, limit: int) -> bytes:
    """The raw request body, at most ``limit`` bytes. Read from the stream, not request.body:
    Django refuses a body past DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB) there, and a replica is
    often larger; REPLICA_MAX_BYTES is this endpoint's own bound."""
    declared = request.META.get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit:
        raise InvalidInput("body", f"is {declared} bytes, more than REPLICA_MAX_BYTES ({limit})")
    stream = request.stream
    if stream is None:
        return b""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = stream.read(min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > limit:
        raise InvalidInput("body", f"is more than REPLICA_MAX_BYTES ({limit}) bytes")
    return b"".join(chunks)
