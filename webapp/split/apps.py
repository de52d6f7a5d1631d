from django.apps import AppConfig


class SplitConfig(AppConfig):
    name = "webapp.split"
    label = "split"
    verbose_name = "Split learning"
