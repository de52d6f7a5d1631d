"""Split-learning studies (one instance, several methods) and the schedule each method found."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone

from orchestrator.sl.solve import METHODS


class SplitStudy(models.Model):
    """One split-learning instance (docs/architecture.md, "Split-learning instance") and the
    settings every method solving it shares."""

    name = models.CharField(max_length=100)
    instance = models.JSONField(help_text="the split-learning instance document")
    source = models.CharField(max_length=300, help_text='where the instance came from: '
                                                        '"data/sl/<file>.jsonl#<index>" or '
                                                        '"uploaded"')
    clients = models.PositiveIntegerField()
    helpers = models.PositiveIntegerField()
    time_limit_s = models.FloatField(help_text="seconds for exact, admm and auto")
    switch_slots = models.PositiveIntegerField(default=0, help_text="reload slots each time a "
                                                                    "helper resumes a task")
    seed = models.PositiveIntegerField(default=0, help_text="seed of random-fcfs and auto")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="split_studies")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ("-created_at", "-id")
        verbose_name_plural = "split studies"

    def __str__(self) -> str:
        return f"split study {self.pk} {self.name}"

    @property
    def instance_name(self) -> str:
        return str(self.instance.get("name", ""))

    @property
    def slot_ms(self) -> float:
        return float(self.instance.get("slot_ms", 0.0))


class SplitSchedule(models.Model):
    """One method's schedule for a study, computed by a Celery task."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    study = models.ForeignKey(SplitStudy, on_delete=models.CASCADE, related_name="schedules")
    method = models.CharField(max_length=32, choices=[(m, m) for m in METHODS])
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    schedule = models.JSONField(null=True, blank=True,
                                help_text="the schedule document (docs/architecture.md)")
    makespan = models.PositiveIntegerField(null=True, blank=True, help_text="slots")
    solver_s = models.FloatField(null=True, blank=True)
    lower_bound = models.PositiveIntegerField(null=True, blank=True,
                                              help_text="the bound the method proved, in slots")
    error = models.TextField(blank=True)
    queued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("study_id", "id")
        constraints = (
            models.UniqueConstraint(fields=["study", "method"],
                                    name="split_schedule_method_unique"),
        )

    def __str__(self) -> str:
        return f"{self.method} schedule of split study {self.study_id} ({self.status})"
