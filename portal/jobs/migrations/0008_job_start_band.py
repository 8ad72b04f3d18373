"""Issue 8 item 4: the band around a pending job's estimated start (earliest, latest)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("jobs", "0007_job_list_indexes")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="estimated_start_earliest_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="estimated_start_latest_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
