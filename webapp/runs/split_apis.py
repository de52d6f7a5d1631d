"""REST endpoints for split runs: ``POST /api/runs/split/`` creates one (its clients and
helpers, cuts and rounds), ``GET /api/runs/<id>/split/`` says how it trains (each batch's
makespan against the plan, each client's progress, each round's held-out accuracy); the
run's other endpoints (plan, start, pause, stop, plans, timeline) are every run's."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.protocol.stagespec import SHARD_SPLITS
from orchestrator.sl.settings import MAX_SLOT_MS, MAX_TIME_LIMIT_S
from orchestrator.sl.solve import METHODS
from webapp.common import fields
from webapp.common.api import get_or_404, validated
from webapp.common.exceptions import Conflict
from webapp.common.schema import errors
from webapp.devices.selectors import device_list, model_spec_list
from webapp.runs import selectors
from webapp.runs.models import LR_MAX, MOMENTUM_MAX, RUN_DEFAULTS
from webapp.runs.serializers import RunOutput
from webapp.runs.services.split import split_run_create
from webapp.runs.split_selectors import split_progress


def _devices(help_text: str) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.PrimaryKeyRelatedField(queryset=device_list()), allow_empty=False,
        max_length=64, help_text=help_text)


class SplitRunCreateApi(APIView):
    class SplitRunCreateInput(serializers.Serializer):
        name = fields.CharField(max_length=100)
        model_spec = serializers.PrimaryKeyRelatedField(queryset=model_spec_list())
        clients = _devices("devices that train part-1 and part-3 on their own data")
        helpers = _devices("devices that train part-2 for the clients a plan assigns them")
        algorithms = serializers.ListField(
            child=fields.CharField(max_length=32), allow_empty=False, max_length=len(METHODS),
            help_text=f"split-learning methods, one plan each: {', '.join(METHODS)}")
        sigma1 = fields.IntegerField(min_value=0, max_value=10**4,
                                     help_text="the last layer of part-1 (from 0)")
        sigma2 = fields.IntegerField(min_value=0, max_value=10**4,
                                     help_text="the last layer of part-2")
        batches = fields.IntegerField(min_value=1, max_value=10**6, required=False, default=20,
                                      help_text="batches of every client a round")
        epochs = fields.IntegerField(min_value=1, max_value=10**4, required=False, default=3,
                                     help_text="rounds (FedAvg of every part after each)")
        slot_ms = fields.FloatField(min_value=1e-3, max_value=MAX_SLOT_MS, required=False,
                                    default=10.0, help_text="the study's slot length")
        shard_split = serializers.ChoiceField(
            choices=SHARD_SPLITS, required=False, default="iid",
            help_text="how the training set is cut among the clients")
        time_limit_s = fields.FloatField(min_value=1e-3, max_value=MAX_TIME_LIMIT_S,
                                         required=False, default=5.0,
                                         help_text="seconds for exact, admm and auto")
        switch_slots = fields.IntegerField(min_value=0, max_value=10**4, required=False,
                                           default=0, help_text="reload slots each time a "
                                                                "helper resumes a task")
        seed = fields.IntegerField(min_value=0, max_value=2**31 - 1, required=False, default=0)
        lr = fields.FloatField(min_value=1e-9, max_value=LR_MAX, required=False,
                               default=RUN_DEFAULTS["lr"])
        momentum = fields.FloatField(min_value=0.0, max_value=MOMENTUM_MAX, required=False,
                                     default=RUN_DEFAULTS["momentum"])

    @extend_schema(request=SplitRunCreateInput, responses={201: RunOutput,
                                                          **errors(400, 401, 403)})
    def post(self, request: Request) -> Response:
        run = split_run_create(**validated(self.SplitRunCreateInput, request),
                               created_by=request.user)
        return Response(RunOutput(get_or_404(selectors.run_list(), run.pk, what="run")).data,
                        status=status.HTTP_201_CREATED)


class SplitProgressOutput(serializers.Serializer):
    planned_makespan_s = serializers.FloatField(
        allow_null=True, help_text="the chosen plan's batch makespan; null before a start")
    batches = serializers.ListField(child=serializers.DictField(), help_text=(
        "{batch, makespan_s} of each batch every client finished: from its first part-1 "
        "forward start to its last part-1 backward end"))
    clients = serializers.ListField(child=serializers.DictField(), help_text=(
        "{device, helper, batches_done, batches} of each client, in client order"))
    round_batches = serializers.IntegerField(help_text="batches of every client a round")
    rounds = serializers.ListField(child=serializers.DictField(), help_text=(
        "{round, applied, accuracy, samples, at} of each round evaluated: the aggregated "
        "model's accuracy on the held-out set"))


class SplitProgressApi(APIView):
    @extend_schema(responses={200: SplitProgressOutput, **errors(
        401, 404, 409, conflict="The run is not a split run.")})
    def get(self, request: Request, run_id: int) -> Response:
        run = get_or_404(selectors.run_list(), run_id, what="run")
        if run.kind != "split":
            raise Conflict(f"run {run.pk} is a {run.kind} run, not a split run",
                           state=run.state, action="show split-learning progress")
        return Response(split_progress(run=run))
