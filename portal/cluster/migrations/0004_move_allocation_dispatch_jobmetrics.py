"""Allocation moved to the jobs app, Dispatch and JobMetrics to the agents app.

State only: the tables keep their names (each moved model sets ``db_table``) and their rows,
constraints and indexes; nothing runs against the database. ``jobs.0002`` and
``agents.0001`` take the models over in the migration state.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("cluster", "0003_jobmetrics_dispatch"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Allocation"),
                migrations.DeleteModel(name="Dispatch"),
                migrations.DeleteModel(name="JobMetrics"),
            ],
            database_operations=[],
        ),
    ]
