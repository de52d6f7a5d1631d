"""REST endpoint for PipeLearn runs: ``POST /api/runs/pipelearn/`` creates one (its server,
its devices, B, iterations an epoch, epochs, the methods to plan: PipeLearn and its
baselines SFL and FL); the run's other endpoints (plan, start, pause, stop, plans, timeline)
are every run's."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from orchestrator.pipelearn_plan import METHODS
from orchestrator.protocol.stagespec import SHARD_SPLITS
from webapp.common import fields
from webapp.common.api import get_or_404, validated
from webapp.common.schema import errors
from webapp.devices.selectors import device_list, model_spec_list
from webapp.runs import selectors
from webapp.runs.models import LR_MAX, MOMENTUM_MAX, RUN_DEFAULTS
from webapp.runs.serializers import RunOutput
from webapp.runs.services.pipelearn import MAX_BATCH, pipelearn_run_create


class OverrideInput(serializers.Serializer):
    device = serializers.PrimaryKeyRelatedField(queryset=device_list(),
                                                help_text="one of the run's clients")
    split = fields.IntegerField(min_value=1, max_value=10**4,
                                help_text="P: layers [0, P) on the device, the rest on the "
                                          "server")
    parallel_batches = fields.IntegerField(min_value=1, max_value=MAX_BATCH,
                                           help_text="N: micro-batches of B // N")


class PipelearnRunCreateApi(APIView):
    class PipelearnRunCreateInput(serializers.Serializer):
        name = fields.CharField(max_length=100)
        model_spec = serializers.PrimaryKeyRelatedField(queryset=model_spec_list())
        server = serializers.PrimaryKeyRelatedField(
            queryset=device_list(), help_text="the device that trains every other's last "
                                              "layers (an edge server)")
        clients = serializers.ListField(
            child=serializers.PrimaryKeyRelatedField(queryset=device_list()),
            allow_empty=False, max_length=64,
            help_text="devices that keep their data and train the first layers")
        algorithms = serializers.ListField(
            child=fields.CharField(max_length=32), allow_empty=False, max_length=len(METHODS),
            required=False, default=list(METHODS),
            help_text=f"methods, one plan each: {', '.join(METHODS)}")
        batch_size = fields.IntegerField(
            min_value=1, max_value=MAX_BATCH, required=False,
            help_text="B, the samples of one iteration (split into N micro-batches); "
                      "default the model spec's")
        batches = fields.IntegerField(min_value=1, max_value=10**6, required=False, default=10,
                                      help_text="iterations of every device an epoch")
        epochs = fields.IntegerField(min_value=1, max_value=10**4, required=False, default=3,
                                     help_text="epochs (FedAvg of each side after each)")
        shard_split = serializers.ChoiceField(
            choices=SHARD_SPLITS, required=False, default="iid",
            help_text="how the training set is cut among the devices")
        lr = fields.FloatField(min_value=1e-9, max_value=LR_MAX, required=False,
                               default=RUN_DEFAULTS["lr"])
        momentum = fields.FloatField(min_value=0.0, max_value=MOMENTUM_MAX, required=False,
                                     default=RUN_DEFAULTS["momentum"])
        overrides = OverrideInput(many=True, required=False, default=list, help_text=(
            "the user's P and N of some devices under PipeLearn (the planner chooses the "
            "others')"))

    @extend_schema(request=PipelearnRunCreateInput, responses={201: RunOutput,
                                                              **errors(400, 401, 403)})
    def post(self, request: Request) -> Response:
        run = pipelearn_run_create(**validated(self.PipelearnRunCreateInput, request),
                                   created_by=request.user)
        return Response(RunOutput(get_or_404(selectors.run_list(), run.pk, what="run")).data,
                        status=status.HTTP_201_CREATED)
