"""How runs and plans look on the wire: in API answers and in the events of a run's group."""

from __future__ import annotations

from rest_framework import serializers


class RunDeviceOutput(serializers.Serializer):
    id = serializers.IntegerField(source="device.id")
    uid = serializers.CharField(source="device.uid")
    name = serializers.CharField(source="device.name")
    status = serializers.CharField(source="device.status")
    position = serializers.IntegerField()


class RunOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField(help_text="pipeline, split (parallel split learning) or "
                                           "pipelearn (PipeLearn and its baselines)")
    split = serializers.JSONField(help_text="a split run's clients, helpers (device uids), "
                                            "cuts, slot_ms, shard_split, time_limit_s, "
                                            "switch_slots, seed; {} for a pipeline run")
    pipelearn = serializers.JSONField(help_text="a PipeLearn run's server, clients (device "
                                                "uids), batch_size B and shard_split; {} "
                                                "otherwise")
    model_spec = serializers.IntegerField(source="model_spec_id")
    devices = RunDeviceOutput(source="run_devices", many=True)
    algorithms = serializers.ListField(child=serializers.CharField())
    schedule = serializers.CharField()
    microbatches = serializers.IntegerField()
    batches = serializers.IntegerField()
    epochs = serializers.IntegerField()
    chain_every = serializers.IntegerField(help_text="batches between chain replicas; 0 = off")
    global_every = serializers.IntegerField(
        help_text="batches between replicas uploaded to the server; 0 = off")
    repartition_after = serializers.IntegerField(
        help_text="batches before the first dynamic re-partition check")
    repartition_every = serializers.IntegerField(
        help_text="batches between dynamic re-partition checks; 0 = off")
    recovery_policy = serializers.CharField(
        help_text="replan (re-plan the survivors) or respipe (the successor takes over)")
    lr = serializers.FloatField(help_text="SGD learning rate of every stage")
    momentum = serializers.FloatField(help_text="SGD momentum of every stage")
    vertical_sync = serializers.BooleanField(
        help_text="1F1B: every stage uses the weight version stage 0 used for the micro-batch; "
                  "ignored under the synchronous gpipe and 1f1b-sync")
    aggregate_every = serializers.IntegerField(
        help_text="1F1B: weight aggregation every this many in-flight windows; 0 = off")
    generation = serializers.IntegerField(
        help_text="the current deployment: 0 at start, +1 at each recovery or re-partition")
    state = serializers.CharField()
    error = serializers.CharField()
    chosen_plan = serializers.IntegerField(source="chosen_plan_id", allow_null=True,
                                           help_text="null until the run is started")
    plans = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True, help_text="null until it starts")
    finished_at = serializers.DateTimeField(allow_null=True, help_text="null until it ends")

    def get_plans(self, run: object) -> list[int]:
        return sorted(p.pk for p in run.plans.all())  # type: ignore[attr-defined]


class TrainingOutput(serializers.Serializer):
    """A learned planner's training curve, one entry per episode so far; every key is absent
    for the other planners (and before the first episode)."""

    episodes = serializers.ListField(child=serializers.IntegerField(), required=False,
                                     help_text="episode numbers, from 1")
    best_reward = serializers.ListField(
        child=serializers.FloatField(allow_null=True), required=False,
        help_text="the best reward seen so far, -sqrt(step time in s); null until a candidate "
                  "fits in memory")
    mean_reward = serializers.ListField(
        child=serializers.FloatField(allow_null=True), required=False,
        help_text="the mean reward of the episode's sampled candidates (infeasible ones "
                  "penalised); null until a candidate fits in memory")


class InterruptionOutput(serializers.Serializer):
    worker = serializers.CharField(help_text="the worker that stopped mid-plan")
    attempt = serializers.IntegerField(help_text="the attempt it cut short, from 1")
    at = serializers.DateTimeField(help_text="when the server noticed")
    reason = serializers.CharField()


class PlanOutput(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.IntegerField(source="run_id")
    algorithm = serializers.CharField()
    status = serializers.CharField()
    # the figures are null until the plan is computed (and after a planning error)
    stages = serializers.IntegerField(allow_null=True)
    period_s = serializers.FloatField(allow_null=True, help_text="predicted time per batch")
    throughput_sps = serializers.FloatField(allow_null=True)
    simulated_throughput_sps = serializers.FloatField(
        allow_null=True, help_text="null too when the plan could not be simulated")
    bottleneck = serializers.CharField()
    memory_ok = serializers.BooleanField(allow_null=True)
    planner_s = serializers.FloatField(allow_null=True)
    error = serializers.CharField()
    training = TrainingOutput()
    attempts = serializers.IntegerField()
    worker = serializers.CharField()
    heartbeat_at = serializers.DateTimeField(
        allow_null=True, help_text="the computing worker's last sign of life")
    interruptions = InterruptionOutput(
        many=True, help_text="earlier attempts whose worker stopped mid-plan, oldest first")
    queued_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class PlanDetailOutput(PlanOutput):
    document = serializers.JSONField(allow_null=True, help_text="the plan (docs/architecture.md); "
                                                                "null until computed")
    simulation = serializers.JSONField(allow_null=True,
                                       help_text="the simulated timeline's summary, or null")
