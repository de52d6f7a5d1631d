"""Runs, their plans, and what they produce: timeline events, fault events, metric points."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone

from orchestrator.events import EVENT_KINDS, FAULT_KINDS
from orchestrator.formats import SCHEDULES
from webapp.devices.models import Device, ModelSpec
from webapp.runs.states import RunState

LR_MAX = 100.0  # a run's SGD learning rate is above 0 and at most this
MOMENTUM_MAX = 0.999  # a run's SGD momentum is from 0 to this (at 1 the buffers never decay)
RECOVERY_POLICIES = ("replan", "respipe")  # what a run does after a failure (recovery_policy)
AGGREGATE_EVERY_MAX = 1000  # a run's aggregate_every is from 0 (off) to this
# one pipeline of stages; parallel split learning; PipeLearn (or its baselines SFL and FL)
RUN_KINDS = ("pipeline", "split", "pipelearn")
# the kinds whose devices may hold stages of several pipelines (RunDevice.parts)
MULTI_PIPELINE_KINDS = ("split", "pipelearn")


class Run(models.Model):
    """Training a model spec on an ordered set of devices: planned with one or several
    algorithms, then started with one of the plans."""

    State = RunState

    name = models.CharField(max_length=100)
    kind = models.CharField(
        max_length=16, choices=[(k, k) for k in RUN_KINDS], default="pipeline",
        help_text="pipeline: the devices train one pipeline (algorithms are pipeline "
                  "planners); split: parallel split learning, its clients and helpers in "
                  "``split`` (algorithms are split-learning methods)")
    split = models.JSONField(
        default=dict, blank=True,
        help_text="a split run's settings (webapp.runs.split.SplitSettings): clients, "
                  "helpers, cuts, slot_ms, shard_split, time_limit_s, switch_slots")
    pipelearn = models.JSONField(
        default=dict, blank=True,
        help_text="a PipeLearn run's settings (webapp.runs.services.pipelearn): server, "
                  "clients, batch_size (B, split into N micro-batches), shard_split")
    model_spec = models.ForeignKey(ModelSpec, on_delete=models.PROTECT, related_name="runs")
    devices = models.ManyToManyField(Device, through="RunDevice", related_name="runs")
    algorithms = models.JSONField(help_text="planner names (orchestrator.partition.PLANNERS)")
    schedule = models.CharField(max_length=16, choices=[(s, s) for s in SCHEDULES],
                                default="1f1b")
    microbatches = models.PositiveIntegerField(default=8)
    batches = models.PositiveIntegerField(default=100, help_text="batches per epoch")
    epochs = models.PositiveIntegerField(default=1)
    lr = models.FloatField(default=0.1, help_text="SGD learning rate of every stage")
    momentum = models.FloatField(default=0.0, help_text="SGD momentum (high momentum on the "
                                                        "stale gradients of 1F1B hurts)")
    # against asynchronous 1F1B's stale weights (FTPipeHD, docs/architecture.md "Run
    # settings"); the synchronous schedules (gpipe, 1f1b-sync) flush every batch, so have none
    vertical_sync = models.BooleanField(
        default=True, help_text="1F1B: every stage forwards and backwards micro-batch m with "
                                "the weight version stage 0 used for it (vertical sync); "
                                "ignored under the synchronous gpipe and 1f1b-sync")
    aggregate_every = models.PositiveIntegerField(
        default=0, help_text="1F1B: every aggregate_every x its in-flight depth D updates, a "
                             "stage replaces its weights by the average of its last D weight "
                             "versions (weight aggregation); 0 = off, and 0 under gpipe "
                             "and 1f1b-sync")
    state = models.CharField(max_length=16, choices=RunState.choices, default=RunState.DRAFT)
    error = models.TextField(blank=True)
    chosen_plan = models.ForeignKey("Plan", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="runs")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # fault tolerance and dynamic re-partition (docs/architecture.md)
    chain_every = models.PositiveIntegerField(
        default=2, help_text="batches between chain replicas (each stage's checkpoint sent to "
                             "the next stage's device); 0 = off")
    global_every = models.PositiveIntegerField(
        default=10, help_text="batches between replicas uploaded to the server; 0 = off")
    repartition_after = models.PositiveIntegerField(
        default=10, help_text="batches before the first dynamic re-partition check")
    repartition_every = models.PositiveIntegerField(
        default=100, help_text="batches between dynamic re-partition checks; "
                               "0 = dynamic re-partition off")
    recovery_policy = models.CharField(
        max_length=16, choices=[(p, p) for p in RECOVERY_POLICIES], default="replan",
        help_text="after a failure: replan (FTPipeHD: re-plan the survivors with the run's "
                  "planner) or respipe (the baseline: the failed stage's successor takes its "
                  "layers)")
    generation = models.PositiveIntegerField(
        default=0, help_text="the current deployment: 0 at start, +1 at each recovery or "
                             "re-partition")
    deployment = models.JSONField(
        default=dict, blank=True, help_text="the current generation: its plan, when it "
                                            "resumed, capacities (states.Deployment)")
    recovery = models.JSONField(default=dict, blank=True,
                                help_text="the recovery under way, empty when none "
                                          "(states.Recovery)")

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = (models.Index(fields=["state"]),)

    def __str__(self) -> str:
        return f"run {self.pk} {self.name} ({self.state})"

    @property
    def total_microbatches(self) -> int:
        """Micro-batches the run trains in all (every stage's schedule runs this many)."""
        return self.microbatches * self.batches * self.epochs


# a run's settings with a default: the one place the REST API, the run service and the run
# form take them from
RUN_DEFAULTS: dict[str, Any] = {
    name: Run._meta.get_field(name).default
    for name in ("schedule", "microbatches", "batches", "epochs", "lr", "momentum",
                 "vertical_sync", "aggregate_every", "chain_every", "global_every",
                 "repartition_after", "repartition_every", "recovery_policy")}


class RunDevice(models.Model):
    """A device of a run, in pipeline order (planners such as ftpipehd keep this order)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="run_devices")
    class StageState(models.TextChoices):
        IDLE = "idle"  # not deployed (the run has not started, or the plan leaves it out)
        DEPLOYING = "deploying"  # the stage was sent, no answer yet
        READY = "ready"  # the agent built its stage and waits for the start
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        HALTING = "halting"  # sent halt (a recovery), no ack yet
        HALTED = "halted"  # stopped; its holdings are known
        LOST = "lost"  # dead or restarted: its stage's state is gone

    device = models.ForeignKey(Device, on_delete=models.PROTECT, related_name="run_devices")
    position = models.PositiveSmallIntegerField()
    stage = models.PositiveSmallIntegerField(null=True, blank=True,
                                             help_text="its stage in the chosen plan")
    stage_state = models.CharField(max_length=16, choices=StageState.choices,
                                   default=StageState.IDLE)
    stage_error = models.TextField(blank=True)
    parts = models.JSONField(
        default=list, blank=True,
        help_text="a device holding several stages of the run (split learning): each "
                  "{pipeline, stage, state}; its stage_state sums them up. Empty otherwise")
    holdings = models.JSONField(
        default=list, blank=True,
        help_text="what the halted agent reported holding: [{layers [a, e], applied, kind}]")
    # the device's fixed costs when the run was planned (devices.selectors.planning_costs):
    # the run's plans, their predictions and its recoveries use them, while the stage it runs
    # measures them anew (None: the device's current ones)
    overhead_s = models.FloatField(
        null=True, blank=True, help_text="the device's overhead_s when the run was planned")
    message_s = models.FloatField(
        null=True, blank=True, help_text="the device's message_s when the run was planned")
    pass_overhead_s = models.FloatField(
        null=True, blank=True,
        help_text="the part of overhead_s inside the passes when the run was planned")

    # the last events batch stored from the device's agent (its stream, a random id per agent
    # process, and the batch's number in it): a batch sent again after a reconnect, because
    # its answer was lost with the connection, is stored once
    events_stream = models.CharField(max_length=64, blank=True)
    events_seq = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ("run_id", "position")
        constraints = (
            models.UniqueConstraint(fields=["run", "device"], name="run_device_unique"),
            models.UniqueConstraint(fields=["run", "position"], name="run_position_unique"),
        )


class Plan(models.Model):
    """One algorithm's plan for a run: the plan document, the cost model's prediction, and what
    the simulator measured of it (they differ: the simulator sees fill, drain and link queues)."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="plans")
    algorithm = models.CharField(max_length=32)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    document = models.JSONField(null=True, blank=True, help_text="the plan (docs/architecture.md)")
    stages = models.PositiveIntegerField(null=True, blank=True)
    period_s = models.FloatField(null=True, blank=True)
    throughput_sps = models.FloatField(null=True, blank=True)
    bottleneck = models.CharField(max_length=100, blank=True)
    memory_ok = models.BooleanField(null=True, blank=True)
    planner_s = models.FloatField(null=True, blank=True)
    simulated_throughput_sps = models.FloatField(null=True, blank=True)
    simulation = models.JSONField(null=True, blank=True,
                                  help_text="the simulated timeline's summary")
    error = models.TextField(blank=True)
    training = models.JSONField(
        default=dict, blank=True,
        help_text="a learned planner's training curve: lists episodes (1-based), best_reward "
                  "and mean_reward (rewards -sqrt(step s); null until a candidate fits); "
                  "empty for the other planners")
    attempts = models.PositiveIntegerField(default=0)
    worker = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(
        null=True, blank=True, help_text="the computing worker's last sign of life")
    interruptions = models.JSONField(
        default=list, blank=True,
        help_text="the attempts whose worker stopped mid-plan: worker, attempt, at, reason")
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("run_id", "id")
        constraints = (
            models.UniqueConstraint(fields=["run", "algorithm"], name="plan_algorithm_unique"),
        )

    def __str__(self) -> str:
        return f"{self.algorithm} plan of run {self.run_id} ({self.status})"


class Generation(models.Model):
    """One deployment of a run: the start (0), then one per recovery or dynamic re-partition;
    kept so the run page and the report show what each re-plan chose and what it cost."""

    class Cause(models.TextChoices):
        START = "start"
        FAILURE = "failure"
        DYNAMIC = "dynamic"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="generations")
    number = models.PositiveIntegerField()
    cause = models.CharField(max_length=16, choices=Cause.choices)
    lost = models.JSONField(default=list, blank=True, help_text="uids of the devices lost")
    planner = models.CharField(max_length=32)
    plan = models.JSONField(help_text="the plan document (docs/architecture.md)")
    predicted_throughput_sps = models.FloatField(null=True, blank=True)
    resume_microbatch = models.PositiveIntegerField(
        default=0, help_text="the resume point V: training restarts at this micro-batch")
    detected_at = models.FloatField(null=True, blank=True,
                                    help_text="seconds since the run started")
    resumed_at = models.FloatField(null=True, blank=True,
                                   help_text="seconds since the run started")
    transfers = models.JSONField(default=list, blank=True,
                                 help_text="the weight parts moved to restore this generation")
    bytes_moved = models.BigIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("run_id", "number")
        constraints = (
            models.UniqueConstraint(fields=["run", "number"], name="generation_number_unique"),
        )

    def __str__(self) -> str:
        return f"generation {self.number} of run {self.run_id} ({self.cause})"


class WeightReplica(models.Model):
    """A stage's weights at some applied v uploaded to the server (global replication): the
    copy of last resort when a device and its chain replica are both lost."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="weight_replicas")
    device = models.CharField(max_length=64, help_text="the uploader's uid")
    first = models.PositiveIntegerField(help_text="first layer (inclusive)")
    last = models.PositiveIntegerField(help_text="last layer (inclusive)")
    applied = models.PositiveIntegerField(
        help_text="micro-batches whose updates the weights contain")
    path = models.CharField(max_length=500, help_text="relative to settings.REPLICA_DIR")
    bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("run_id", "first", "applied")
        constraints = (
            models.UniqueConstraint(fields=["run", "first", "last", "applied"],
                                    name="weight_replica_unique"),
        )

    def __str__(self) -> str:
        return (f"replica of layers {self.first}-{self.last} at applied {self.applied} "
                f"(run {self.run_id})")


class RunEventSeq(models.Model):
    """The number of the newest event sent to a run's Channels group (webapp.runs.events), kept
    apart from the run's row, which saves of the whole run would write back stale."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, primary_key=True,
                               related_name="+")
    seq = models.PositiveBigIntegerField(default=0)


class TimelineEvent(models.Model):
    """A forward, backward, transfer or update of one micro-batch on one device (the shared
    timeline schema; ``device`` is the device's uid). Stored in bulk."""

    # no index of its own: (run, start) leads with it (one index less to keep at each of the
    # thousands of rows a second a training run stores)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="timeline_events",
                            db_index=False)
    device = models.CharField(max_length=64)
    stage = models.PositiveIntegerField()
    pipeline = models.PositiveIntegerField(default=0, help_text="which of the run's pipelines")
    kind = models.CharField(max_length=16, choices=[(k, k) for k in EVENT_KINDS])
    microbatch = models.PositiveIntegerField()
    version = models.PositiveIntegerField()
    start = models.FloatField(help_text="seconds since the run started")
    end = models.FloatField()
    bytes = models.BigIntegerField(default=0)

    class Meta:
        ordering = ("run_id", "start", "id")
        # (run, end): the live window (the events that end in the last minute, the newest
        # LIVE_MAX_EVENTS of them), read every LIVE_IDLE_INTERVAL_S while a run trains and at
        # each page's connect; without it each read scanned the whole run (166 ms at 123,000
        # events, 32 ms with it)
        indexes = (models.Index(fields=["run", "start"]), models.Index(fields=["run", "end"]))


class FaultEvent(models.Model):
    """A fault or control event of a run (device lost, re-partitioned, run paused, ...)."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="fault_events")
    at = models.FloatField(help_text="seconds since the run started")
    kind = models.CharField(max_length=32, choices=[(k, k) for k in FAULT_KINDS])
    device = models.CharField(max_length=64, blank=True)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ("run_id", "at", "id")
        indexes = (models.Index(fields=["run", "at"]),)


class MetricPoint(models.Model):
    """A training metric at a time of a run, for the whole run or one device."""

    class Kind(models.TextChoices):
        THROUGHPUT_SPS = "throughput_sps"
        NETWORK_BPS = "network_bps"
        LOSS = "loss"
        ACCURACY = "accuracy"
        # a split run's aggregated model on the held-out set, once a round (split_rounds)
        TEST_ACCURACY = "test_accuracy"
        IDLE_FRACTION = "idle_fraction"
        # the device's system figures (orchestrator.protocol.SYSTEM_METRICS; agent.system)
        CPU_PCT = "cpu_pct"
        PROC_CPU_PCT = "proc_cpu_pct"
        PROC_RSS_BYTES = "proc_rss_bytes"
        MEM_USED_BYTES = "mem_used_bytes"
        MEM_TOTAL_BYTES = "mem_total_bytes"
        TEMP_C = "temp_c"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="metric_points",
                            db_index=False)  # (run, at) leads with it, as TimelineEvent's
    at = models.FloatField(help_text="seconds since the run started")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    device = models.CharField(max_length=64, blank=True)
    value = models.FloatField()

    class Meta:
        ordering = ("run_id", "at", "id")
        indexes = (models.Index(fields=["run", "at"]), models.Index(fields=["run", "kind", "at"]))


class Probe(models.Model):
    """A run's probe while it is out: stage 0's backward timer fired, every staged device was
    asked whether it still holds its stage, and the answers so far. In the database, not in a
    web process's memory: with several web processes an answer may reach any of them, and the
    verdict is a Celery task with a countdown (webapp.runs.tasks.probe_verdict)."""

    run = models.OneToOneField(Run, on_delete=models.CASCADE, related_name="probe")
    generation = models.PositiveIntegerField()
    asked = models.JSONField(default=list, help_text="uids of the devices probed")
    answers = models.JSONField(default=dict, help_text="uid: whether it holds its stage")
    created_at = models.DateTimeField(default=timezone.now)
