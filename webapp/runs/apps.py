from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "webapp.runs"
    label = "runs"
    verbose_name = "Runs and plans"

    def ready(self) -> None:
        # connects the signal that deletes a replica's file with its row
        from webapp.runs import replicas  # noqa: F401
