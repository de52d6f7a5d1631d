"""Run.recovery held the current generation's plan and a recovery's working state at once:
the current generation moves to Run.deployment, and Run.recovery keeps only a recovery under
way (empty when none)."""

from typing import Any

from django.db import migrations, models

DEPLOYMENT_KEYS = ("plan", "since_s", "restart_s", "next_check", "capacity", "estimate")


def split(apps: Any, schema_editor: Any) -> None:
    Run = apps.get_model("runs", "Run")
    for run in Run.objects.exclude(recovery={}).only("pk", "recovery"):
        old = run.recovery if isinstance(run.recovery, dict) else {}
        run.deployment = {k: old[k] for k in DEPLOYMENT_KEYS if k in old}
        run.recovery = ({k: v for k, v in old.items() if k not in DEPLOYMENT_KEYS}
                        if old.get("generation") is not None else {})
        run.save(update_fields=["deployment", "recovery"])


def join(apps: Any, schema_editor: Any) -> None:
    Run = apps.get_model("runs", "Run")
    for run in Run.objects.exclude(deployment={}).only("pk", "deployment", "recovery"):
        run.recovery = {**run.deployment, **run.recovery}
        run.save(update_fields=["recovery"])


class Migration(migrations.Migration):
    dependencies = [("runs", "0012_shared_detection_state")]

    operations = [
        migrations.AddField(
            model_name="run", name="deployment",
            field=models.JSONField(blank=True, default=dict, help_text=(
                "the current generation: its plan, when it resumed, capacities "
                "(states.Deployment)"))),
        migrations.AlterField(
            model_name="run", name="recovery",
            field=models.JSONField(blank=True, default=dict, help_text=(
                "the recovery under way, empty when none (states.Recovery)"))),
        migrations.RunPython(split, join),
    ]
