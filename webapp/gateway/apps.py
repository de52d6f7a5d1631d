from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "webapp.gateway"
    label = "gateway"
    verbose_name = "Agent gateway"
