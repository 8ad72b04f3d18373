from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "portal.ops"
    label = "ops"

    def ready(self) -> None:
        # Times read from PostgreSQL are parsed by psycopg's compiled loader (portal.db_loaders).
        from portal import db_loaders

        db_loaders.install()
