"""Settings a deployment depends on, checked in fresh processes as an operator starts them:
the secret key, the HTTPS settings, and a log that holds every 500's traceback."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
GOOD_KEY = "k" * 30 + "-throwaway-test-key-" + "abcdefghijklmnop"

# Variables this file sets itself; whatever the caller's shell has of them is left out.
OWN = (
    "PORTAL_",
    "DATABASE_URL",
    "REDIS_URL",
)


def clean_env(var_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(OWN)}
    env.update({"PORTAL_VAR_DIR": str(var_dir), "DJANGO_SETTINGS_MODULE": "portal.settings"})
    env.update(extra)
    return env


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=120,
    )


SHOW_SETTINGS = """
    import django
    django.setup()
    from django.conf import settings as s
    print(s.SECRET_KEY)
    print(s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, s.SECURE_HSTS_PRELOAD)
    print(s.SECURE_SSL_REDIRECT, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE)
    print(s.SECURE_PROXY_SSL_HEADER, s.CSRF_TRUSTED_ORIGINS)
"""


def test_production_refuses_to_start_without_a_secret_key_in_one_line(tmp_path: Path) -> None:
    result = python(SHOW_SETTINGS, clean_env(tmp_path, PORTAL_DEPLOYMENT="production"))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "portal: configuration error: PORTAL_SECRET_KEY is not set; production "
        "(PORTAL_DEPLOYMENT=production) needs a long random key, e.g. from "
        'python -c "import secrets; print(secrets.token_urlsafe(50))"'
    ]


def test_production_refuses_a_short_key(tmp_path: Path) -> None:
    env = clean_env(tmp_path, PORTAL_DEPLOYMENT="production", PORTAL_SECRET_KEY="secret")
    result = python(SHOW_SETTINGS, env)
    assert result.returncode == 2
    assert "PORTAL_SECRET_KEY: too short or too plain for production" in result.stderr
    assert len(result.stderr.splitlines()) == 1


def test_production_turns_https_on_by_default_and_each_setting_can_be_changed(
    tmp_path: Path,
) -> None:
    env = clean_env(tmp_path, PORTAL_DEPLOYMENT="production", PORTAL_SECRET_KEY=GOOD_KEY)
    lines = python(SHOW_SETTINGS, env).stdout.splitlines()
    assert lines == [
        GOOD_KEY,
        "31536000 True True",
        "True True True",
        "None []",
    ]

    env.update(
        PORTAL_HSTS_SECONDS="600",
        PORTAL_HSTS_PRELOAD="off",
        PORTAL_SSL_REDIRECT="off",
        PORTAL_SECURE_PROXY_SSL_HEADER="on",
        PORTAL_CSRF_TRUSTED_ORIGINS="https://gpu.example.org",
    )
    lines = python(SHOW_SETTINGS, env).stdout.splitlines()
    assert lines[1:] == [
        "600 True False",
        "False True True",
        "('HTTP_X_FORWARDED_PROTO', 'https') ['https://gpu.example.org']",
    ]


def test_an_origin_without_a_scheme_is_refused(tmp_path: Path) -> None:
    env = clean_env(tmp_path, PORTAL_CSRF_TRUSTED_ORIGINS="gpu.example.org")
    result = python(SHOW_SETTINGS, env)
    assert result.returncode == 2
    assert "PORTAL_CSRF_TRUSTED_ORIGINS: 'gpu.example.org' has no scheme" in result.stderr


def test_embedded_makes_a_random_key_once_and_keeps_it_private(tmp_path: Path) -> None:
    first = python(SHOW_SETTINGS, clean_env(tmp_path)).stdout.splitlines()
    second = python(SHOW_SETTINGS, clean_env(tmp_path)).stdout.splitlines()
    other = python(SHOW_SETTINGS, clean_env(tmp_path / "other")).stdout.splitlines()

    assert first[0] == second[0] != other[0]
    assert len(first[0]) >= 50
    key_file = tmp_path / "secret_key"
    assert key_file.read_text().strip() == first[0]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    # Plain HTTP on 127.0.0.1: none of the HTTPS settings.
    assert first[1:3] == ["0 False False", "False False False"]


def test_a_bad_log_level_is_refused_naming_the_choices(tmp_path: Path) -> None:
    result = python(SHOW_SETTINGS, clean_env(tmp_path, PORTAL_LOG_LEVEL="loud"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "portal: configuration error: PORTAL_LOG_LEVEL='loud': "
        "expected one of debug, info, warning, error, critical"
    )


@pytest.mark.parametrize("path", ["/login/", "/api/v1/jobs/"])
def test_a_500_leaves_its_traceback_on_stderr_in_the_log_format(tmp_path: Path, path: str) -> None:
    # A page and an API view that crash: neither needs the database to get that far.
    code = f"""
        import django
        django.setup()
        from unittest import mock
        from django.test import Client
        boom = RuntimeError("the view broke")
        with mock.patch("portal.web.login.ThrottledLoginView.get", side_effect=boom), \\
                mock.patch("portal.api.auth.PortalTokenAuthentication.authenticate",
                           side_effect=boom):
            response = Client(raise_request_exception=False).get({path!r})
        print(response.status_code, response["Content-Type"])
    """
    env = clean_env(tmp_path, PORTAL_LOG_FORMAT="LOG %(levelname)s %(name)s: %(message)s")
    result = python(code, env)

    assert result.stdout.split()[0] == "500", result.stderr
    assert f"LOG ERROR django.request: Internal Server Error: {path}" in result.stderr
    assert "Traceback (most recent call last):" in result.stderr
    assert "RuntimeError: the view broke" in result.stderr
    if path.startswith("/api/"):
        assert result.stdout.split()[1] == "application/json"
