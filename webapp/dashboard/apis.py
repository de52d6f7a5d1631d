"""Data the run page fetches besides its WebSocket: its plans' layouts (stages, the groups of
devices serving them, betas and the planners' notes), a plan's planned timeline (the
simulator's Gantt of a couple of batches) and the chosen plan's planned events over a span of
run time (the live Gantt's ghosts). Session users; errors in the API's one JSON shape."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.common.api import get_or_404
from webapp.common.exceptions import Conflict
from webapp.common.schema import errors
from webapp.dashboard import planned, selectors
from webapp.runs.models import Plan, Run
from webapp.runs.selectors import plan_list, run_list


def _timeline_events() -> serializers.ListField:
    return serializers.ListField(child=serializers.DictField(),
                                 help_text="timeline events (docs/architecture.md)")


UNSIMULATED = ("The plan cannot be simulated: it is not computed, or the run's devices or "
               "profiles have changed since.")


def _run(run_id: int) -> Run:
    return get_or_404(run_list(), run_id, what="run")


def _query(serializer_class: type[serializers.Serializer], request: Request) -> dict:
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return dict(query.validated_data)


class PlanLayoutsApi(APIView):
    @extend_schema(responses={200: inline_serializer("PlanLayouts", {
        "run": serializers.IntegerField(),
        "layouts": serializers.ListField(
            child=serializers.DictField(),
            help_text="per plan with a document: plan, algorithm, summary, stages (stage, "
                      "layers, replicas, text, devices: device, label, beta, sequential, "
                      "passes), beta (whether it has one) and notes")}),
        **errors(401, 404)})
    def get(self, request: Request, run_id: int) -> Response:
        run = _run(run_id)
        return Response({"run": run.pk, "layouts": selectors.run_plan_layouts(run=run)})


class PlanTimelineApi(APIView):
    class TimelineQuery(serializers.Serializer):
        batches = serializers.IntegerField(min_value=1, max_value=planned.MAX_PLANNED_BATCHES,
                                           required=False, default=planned.PLANNED_BATCHES)

    @extend_schema(parameters=[TimelineQuery], responses={
        200: inline_serializer("PlannedTimeline", {
            "plan": serializers.IntegerField(), "algorithm": serializers.CharField(),
            "schedule": serializers.CharField(), "batches": serializers.IntegerField(),
            "microbatches": serializers.IntegerField(),
            "rows": serializers.ListField(child=serializers.DictField()),
            "makespan_s": serializers.FloatField(), "throughput_sps": serializers.FloatField(),
            "events": _timeline_events()}),
        **errors(400, 401, 404, 409, conflict=UNSIMULATED)})
    def get(self, request: Request, run_id: int, plan_id: int) -> Response:
        run = _run(run_id)
        plan = get_or_404(plan_list(run=run), plan_id, what=f"plan of run {run.pk}")
        return Response(planned.plan_timeline(run=run, plan=plan,
                                                **_query(self.TimelineQuery, request)))


class RunPlannedApi(APIView):
    class PlannedQuery(serializers.Serializer):
        # query parameters are text: DRF's own fields parse them
        start = serializers.FloatField(min_value=0.0, help_text="seconds since the run started")
        end = serializers.FloatField(min_value=0.0)
        plan = serializers.IntegerField(min_value=1, required=False,
                                        help_text="default: the run's chosen plan")

        def validate(self, data: dict) -> dict:
            if data["end"] < data["start"]:
                raise serializers.ValidationError(
                    {"end": f"must not be before start ({data['start']:g})"})
            if data["end"] - data["start"] > planned.MAX_GHOST_SPAN_S:
                raise serializers.ValidationError(
                    {"end": f"must be at most {planned.MAX_GHOST_SPAN_S:g} s after start"})
            return data

    @extend_schema(parameters=[PlannedQuery], responses={
        200: inline_serializer("PlannedWindow", {
            "plan": serializers.IntegerField(), "algorithm": serializers.CharField(),
            "anchor_s": serializers.FloatField(), "batch_period_s": serializers.FloatField(),
            "start_s": serializers.FloatField(), "end_s": serializers.FloatField(),
            "truncated": serializers.BooleanField(),
            "events": _timeline_events()}),
        **errors(400, 401, 404, 409, conflict="The run has no chosen plan yet (and none is "
                                              f"named), or {UNSIMULATED[0].lower()}"
                                              f"{UNSIMULATED[1:]}")})
    def get(self, request: Request, run_id: int) -> Response:
        run = _run(run_id)
        query = _query(self.PlannedQuery, request)
        plan_id = query.get("plan", run.chosen_plan_id)
        if plan_id is None:
            raise Conflict(f"run {run.pk} is {run.state} and has no chosen plan yet",
                           state=run.state, action="show its planned timeline")
        plan: Plan = get_or_404(plan_list(run=run), plan_id, what=f"plan of run {run.pk}")
        return Response(planned.plan_ghost_timeline(run=run, plan=plan,
                                                      start_s=query["start"],
                                                      end_s=query["end"]))
