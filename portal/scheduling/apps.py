from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "portal.scheduling"
    label = "scheduling"
