from django.apps import AppConfig


class DevicesConfig(AppConfig):
    name = "webapp.devices"
    label = "devices"
    verbose_name = "Devices and profiles"

    def ready(self) -> None:
        from webapp.common import schema  # noqa: F401  (registers the auth schemes)
