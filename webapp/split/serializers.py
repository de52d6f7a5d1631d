"""How split-learning studies look on the wire, and the body that creates one (shared by the
REST API and the page's form, so both refuse the same input for the same reason). The input
serializer checks types only; the service checks ranges and meaning, naming the field."""

from __future__ import annotations

from rest_framework import serializers

from orchestrator.sl.solve import DEFAULT_TIME_LIMIT_S
from webapp.common import fields
from webapp.split import selectors
from webapp.split.models import SplitStudy


class SplitStudyCreateInput(serializers.Serializer):
    name = fields.CharField(max_length=100)
    instance = fields.ObjectField(required=False, help_text="an instance document "
                                  "(docs/architecture.md); or give file and index instead")
    file = fields.CharField(max_length=200, required=False,
                            help_text="a shared instance file (GET /api/split/instances/)")
    index = fields.IntegerField(required=False, help_text="the instance's index in file, from 0")
    methods = serializers.ListField(child=fields.CharField(max_length=32), allow_empty=False,
                                    max_length=16, help_text="exact, admm, balanced-greedy, "
                                                             "random-fcfs, auto")
    time_limit_s = fields.FloatField(required=False, default=DEFAULT_TIME_LIMIT_S,
                                     help_text="seconds for exact, admm and auto: more than 0, "
                                               "at most 120")
    switch_slots = fields.IntegerField(required=False, default=0,
                                       help_text="reload slots each time a helper resumes a "
                                                 "task")
    seed = fields.IntegerField(required=False, default=0,
                               help_text="seed of random-fcfs and auto")


class SplitScheduleOutput(serializers.Serializer):
    id = serializers.IntegerField()
    study = serializers.IntegerField(source="study_id")
    method = serializers.CharField()
    status = serializers.CharField()
    makespan = serializers.IntegerField(allow_null=True, help_text="slots")
    solver_s = serializers.FloatField(allow_null=True)
    lower_bound = serializers.IntegerField(allow_null=True,
                                           help_text="the bound the method proved, in slots")
    error = serializers.CharField()
    queued_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class SplitScheduleDetailOutput(SplitScheduleOutput):
    schedule = serializers.JSONField(allow_null=True, help_text="the schedule document")


class SplitStudyOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    source = serializers.CharField()
    instance_name = serializers.CharField()
    clients = serializers.IntegerField()
    helpers = serializers.IntegerField()
    slot_ms = serializers.FloatField()
    time_limit_s = serializers.FloatField()
    switch_slots = serializers.IntegerField()
    seed = serializers.IntegerField()
    status = serializers.SerializerMethodField(help_text="running, done or failed")
    created_by = serializers.CharField(source="created_by.username", allow_null=True)
    created_at = serializers.DateTimeField()
    schedules = SplitScheduleOutput(many=True)

    def get_status(self, study: SplitStudy) -> str:
        return selectors.split_study_status(study=study)


class SplitStudyDetailOutput(SplitStudyOutput):
    instance = serializers.JSONField(help_text="the instance document")
    schedules = SplitScheduleDetailOutput(many=True)  # type: ignore[assignment]


class SplitCompareRowOutput(serializers.Serializer):
    schedule = serializers.IntegerField()
    method = serializers.CharField()
    status = serializers.CharField()
    makespan = serializers.IntegerField(allow_null=True, help_text="slots")
    makespan_s = serializers.FloatField(allow_null=True)
    gap_to_best = serializers.FloatField(allow_null=True,
                                         help_text="(makespan - best) / best")
    gap_to_bound = serializers.FloatField(allow_null=True,
                                          help_text="(makespan - lower bound) / lower bound")
    lower_bound = serializers.IntegerField(allow_null=True)
    solver_s = serializers.FloatField(allow_null=True)
    error = serializers.CharField()


class SplitCompareOutput(serializers.Serializer):
    best = serializers.IntegerField(allow_null=True, help_text="the best schedule's id")
    reason = serializers.CharField()
    lower_bound = serializers.IntegerField(help_text="the best lower bound known, in slots")
    lower_bound_from = serializers.CharField(help_text='"simple" or the method that proved it')
    rows = SplitCompareRowOutput(many=True)


class SplitGanttRowOutput(serializers.Serializer):
    label = serializers.CharField()
    kind = serializers.ChoiceField(choices=["helper", "client"])
    helper = serializers.IntegerField()


class SplitGanttBarOutput(serializers.Serializer):
    row = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=[*selectors.HELPER_KINDS, *selectors.CLIENT_KINDS])
    client = serializers.IntegerField()
    helper = serializers.IntegerField()
    start = serializers.IntegerField()
    end = serializers.IntegerField()


class SplitGanttOutput(serializers.Serializer):
    schedule = serializers.IntegerField()
    method = serializers.CharField()
    makespan = serializers.IntegerField()
    slot_ms = serializers.FloatField()
    completion = serializers.ListField(child=serializers.IntegerField())
    rows = SplitGanttRowOutput(many=True)
    bars = SplitGanttBarOutput(many=True)


class SharedInstanceOutput(serializers.Serializer):
    file = serializers.CharField()
    index = serializers.IntegerField()
    source = serializers.CharField()
    name = serializers.CharField()
    clients = serializers.IntegerField()
    helpers = serializers.IntegerField()

