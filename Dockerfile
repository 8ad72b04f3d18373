# The production image: one image for the web server, the control-plane worker, beat and the
# GPU agent; docker-compose.yml picks the command. Build: docker build -t gpu-portal .
FROM python:3.11-slim

# The processes run from /app, where templates/ and static/ live beside the code (settings
# find them relative to the portal package), hence PYTHONPATH.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PORTAL_VAR_DIR=/app/var \
    PYTHONPATH=/app

WORKDIR /app

# The package and its dependencies; templates and static files come after, so editing them
# does not re-run the install.
COPY pyproject.toml README.md ./
COPY portal ./portal
COPY scheduler ./scheduler
COPY workers ./workers
RUN pip install .

COPY manage.py ./
COPY templates ./templates
COPY static ./static

# Static files are collected into the image; WhiteNoise serves them from gunicorn. The build
# runs as "embedded", which makes a key in /app/var: it must not ship in the image.
RUN python manage.py collectstatic --noinput \
    && rm -f /app/var/secret_key \
    && useradd --create-home --uid 1000 --shell /usr/sbin/nologin portal \
    && mkdir -p /app/var \
    && chown -R portal:portal /app/var

# Any container of this image is a deployment: it refuses to start without PORTAL_SECRET_KEY.
ENV PORTAL_DEPLOYMENT=production

USER portal
EXPOSE 8000
CMD ["gunicorn", "portal.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--threads", "4", "--access-logfile", "-"]
