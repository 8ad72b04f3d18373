from django.apps import AppConfig


class AccountingConfig(AppConfig):
    name = "portal.accounting"
    label = "accounting"
