"""A team's container policy: its image allow-list, its jobs' network, a read-only root."""

from __future__ import annotations

import django.core.validators
from django.db import migrations, models

import portal.tenants.models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0003_api_tokens_from_plaintext"),
    ]

    operations = [
        migrations.AddField(
            model_name="team",
            name="allowed_image_prefixes",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text=(
                    'images the team may run, as prefixes: ["registry.example.org/vision/", '
                    '"python:"]. A prefix ending in / or : allows what follows it; any other '
                    "names a whole repository (followed by nothing, :tag, @digest or /path). "
                    "Empty = any image"
                ),
                validators=[portal.tenants.models.validate_image_prefixes],
            ),
        ),
        migrations.AddField(
            model_name="team",
            name="job_network",
            field=models.CharField(
                blank=True,
                help_text=(
                    "a Docker network the team's jobs join (the hosts must allow it); "
                    "empty = no network"
                ),
                max_length=128,
                validators=[
                    django.core.validators.RegexValidator(
                        "^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", "a Docker network name"
                    ),
                    portal.tenants.models.validate_job_network,
                ],
            ),
        ),
        migrations.AddField(
            model_name="team",
            name="read_only_rootfs",
            field=models.BooleanField(
                default=False,
                help_text=(
                    "the team's containers get a read-only root filesystem (they write to /scratch)"
                ),
            ),
        ),
    ]
