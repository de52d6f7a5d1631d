"""Devices, how they enrol, what they train and how fast they train it."""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db import models
from django.utils import timezone


class EnrollmentToken(models.Model):
    """A secret a user hands to a device so that it can enrol; shown once, stored as a digest.
    It expires, can be revoked, and admits ``max_uses`` devices."""

    label = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="first characters, to recognise it")
    token_digest = models.CharField(max_length=64, unique=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="enrollment_tokens")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.label or 'enrolment token'})"

    def refusal(self, now: timezone.datetime) -> str | None:
        """Why the token cannot enrol a device now, or None if it can."""
        if self.revoked_at is not None:
            return "has been revoked"
        if self.expires_at <= now:
            return "has expired"
        if self.uses >= self.max_uses:
            return f"has been used by {self.uses} device(s), its maximum"
        return None


class Device(models.Model):
    """An enrolled edge device. ``uid`` is its id in plans and timeline events: a slug set at
    enrolment and never changed (``name`` is the renamable display name)."""

    class Status(models.TextChoices):
        ONLINE = "online"
        BUSY = "busy"
        OFFLINE = "offline"
        RETIRED = "retired"

    uid = models.SlugField(max_length=64, unique=True, editable=False)
    name = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ONLINE)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    hardware = models.JSONField(default=dict, blank=True,
                                help_text="the agent's description: CPU, GPU, OS, Python, torch")
    resources = models.JSONField(
        default=list, blank=True,
        help_text="the compute resources its agent emulates (--resources), as it said when it "
                  "last connected: [{kind, speed, backward_speed}], speeds relative to each "
                  "other; empty: one resource")
    # Planning derives speeds from the devices' profiles instead (runs.selectors).
    speed = models.FloatField(default=1.0, help_text=(
        "relative speed as measured: the fastest device's time per batch over this one's, on "
        "the model profiled last"))
    memory_bytes = models.BigIntegerField()
    bandwidth_bps = models.FloatField()
    uplink_bps = models.FloatField(null=True, blank=True)
    downlink_bps = models.FloatField(null=True, blank=True)
    latency_s = models.FloatField(default=0.0)
    overhead_s = models.FloatField(
        default=0.0, help_text="fixed time a micro-batch costs a stage on it beyond its layers, "
                               "as its agent measured it")
    message_s = models.FloatField(
        default=0.0, help_text="time a stage on it spends on each message it sends, as its "
                               "agent measured it")
    data_address = models.CharField(
        max_length=200, blank=True,
        help_text="where the agent receives tensors from its neighbours (tcp://host:port), as it "
                  "said when it last connected")
    data_key = models.CharField(
        max_length=40, blank=True,
        help_text="the public CURVE key of the agent's data plane (Z85), as it said when it last "
                  "connected; its peers admit and encrypt to this key only")
    control_channel = models.CharField(
        max_length=200, blank=True, editable=False,
        help_text="the Channels name of the agent's current control connection")
    key_hash = models.CharField(max_length=128, editable=False)
    enrollment_token = models.ForeignKey(EnrollmentToken, null=True, blank=True,
                                         on_delete=models.SET_NULL, related_name="devices")
    enrolled_at = models.DateTimeField(default=timezone.now)
    retired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("name", "id")
        constraints = (
            models.CheckConstraint(condition=models.Q(memory_bytes__gt=0),
                                   name="device_memory_positive"),
            models.CheckConstraint(condition=models.Q(bandwidth_bps__gt=0),
                                   name="device_bandwidth_positive"),
            models.CheckConstraint(condition=models.Q(latency_s__gte=0),
                                   name="device_latency_not_negative"),
        )

    def __str__(self) -> str:
        return f"{self.name} ({self.uid})"

    @property
    def named(self) -> str:
        """The device as an error or a fault names it: 'name' (uid)."""
        return f"{self.name!r} ({self.uid})"


def devices_named(devices: Iterable[Device]) -> str:
    """Devices as an error names them: 'a' (uid-a), 'b' (uid-b)."""
    return ", ".join(d.named for d in devices)


class ModelSpec(models.Model):
    """What is trained: a model of the agents' zoo, a dataset and the micro-batch size its
    profiles are measured for."""

    model = models.CharField(max_length=64)
    dataset = models.CharField(max_length=64)
    batch_size = models.PositiveIntegerField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("model", "dataset", "batch_size")
        constraints = (
            models.UniqueConstraint(fields=["model", "dataset", "batch_size"],
                                    name="model_spec_unique"),
        )

    def __str__(self) -> str:
        return f"{self.model} on {self.dataset}, batch {self.batch_size}"


class LayerProfile(models.Model):
    """A model profile (orchestrator.formats) measured on one device: its forward and backward
    time per layer, with the layer sizes."""

    device = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="profiles")
    model_spec = models.ForeignKey(ModelSpec, on_delete=models.PROTECT, related_name="profiles")
    document = models.JSONField()
    num_layers = models.PositiveIntegerField()
    forward_s = models.FloatField(help_text="sum over the layers")
    backward_s = models.FloatField(help_text="sum over the layers")
    measured_at = models.DateTimeField(default=timezone.now)
    # as the device's stages of the model measured them in runs, each run's blended in
    # (orchestrator.capacity.fixed_costs_blended; None: none did, and planning uses the
    # device's own, its agent's probes)
    overhead_s = models.FloatField(
        null=True, blank=True,
        help_text="the fixed time a micro-batch of this model cost a stage on the device "
                  "beyond its layers and its sends, as runs measured it (a weighted mean)")
    message_s = models.FloatField(
        null=True, blank=True,
        help_text="the time a stage of this model on the device spent on each message it "
                  "sent, as runs measured it (a weighted mean)")
    pass_overhead_s = models.FloatField(
        null=True, blank=True,
        help_text="the part of overhead_s spent inside the stage's forward, backward and "
                  "update passes (their timeline events count it), as runs measured it (a "
                  "weighted mean)")

    class Meta:
        ordering = ("device_id", "model_spec_id")
        constraints = (
            models.UniqueConstraint(fields=["device", "model_spec"],
                                    name="layer_profile_unique"),
        )

    def __str__(self) -> str:
        return f"{self.model_spec} on {self.device.uid}"


class DeviceLink(models.Model):
    """A link between two devices as ``source``'s agent measured it over the data plane:
    bandwidth (bytes/s) and latency (s). Planning takes the slower direction of a pair."""

    source = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="links_out")
    target = models.ForeignKey(Device, on_delete=models.CASCADE, related_name="links_in")
    bandwidth_bps = models.FloatField()
    latency_s = models.FloatField()
    measured_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("source_id", "target_id")
        constraints = (
            models.UniqueConstraint(fields=["source", "target"], name="device_link_unique"),
            models.CheckConstraint(condition=models.Q(bandwidth_bps__gt=0),
                                   name="device_link_bandwidth_positive"),
        )

    def __str__(self) -> str:
        return f"{self.source.uid} -> {self.target.uid}: {self.bandwidth_bps / 1e6:.1f} MB/s"


class Supervision(models.Model):
    """A process on the server's machine that started a device's agent and can start it again
    (the demo's local testbed): what lets a user restart an agent from the browser. The
    supervisor marks it seen every few seconds; a restart asked for is taken by it."""

    device = models.OneToOneField(Device, on_delete=models.CASCADE, related_name="supervision")
    supervisor = models.CharField(max_length=200, help_text="who restarts it: the demo's pid "
                                                            "and host")
    seen_at = models.DateTimeField(help_text="the supervisor's last sign of life")
    restart_requested_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.device} supervised by {self.supervisor}"


class PendingCommand(models.Model):
    """A command to an agent sent from a process whose channel layer does not reach the
    agents' connections (a Celery worker on the embedded setup, whose in-memory layer is its
    own): the web process holding the device's connection sends it on
    (webapp.devices.commands). Deleted once sent, or once too old to send (as a command to a
    group nobody is in is dropped)."""

    device = models.CharField(max_length=64, db_index=True, help_text="the device's uid")
    command = models.JSONField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.command.get('command', '?')} for {self.device}"
