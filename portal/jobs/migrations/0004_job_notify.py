from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0003_verbose_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="notify",
            field=models.JSONField(blank=True, default=None, null=True),
        ),
    ]
