"""Where the portal's address and your token come from: the environment first
(``PORTAL_URL``, ``PORTAL_TOKEN``), then the file ``gpu-portal login`` wrote.

The file is ``$GPU_PORTAL_CONFIG`` when set, else ``$XDG_CONFIG_HOME/gpu-portal/config.json``
(``~/.config/gpu-portal/config.json``): ``{"url": ..., "token": ...}``, readable by you only
(mode 0600 in a 0700 directory). Beside it, ``last-job`` remembers the id of the job this
machine's ``gpu-portal submit`` made last, so ``gpu-portal logs -f`` needs no id.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


class ConfigError(ValueError):
    """No portal address or token anywhere, or a config file that cannot be read."""


@dataclass(frozen=True)
class Settings:
    url: str
    token: str


def config_path() -> Path:
    explicit = os.environ.get("GPU_PORTAL_CONFIG", "").strip()
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME", "").strip() or "~/.config"
    return Path(base).expanduser() / "gpu-portal" / "config.json"


def load_settings(*, url: str | None = None, token: str | None = None) -> Settings:
    """The address and token to use: what is given, else the environment, else the file."""
    url = url or os.environ.get("PORTAL_URL", "").strip() or None
    token = token or os.environ.get("PORTAL_TOKEN", "").strip() or None
    if url is None or token is None:
        saved = read_config()
        url = url or saved.get("url") or None
        token = token or saved.get("token") or None
    missing = [name for name, value in (("PORTAL_URL", url), ("PORTAL_TOKEN", token)) if not value]
    if missing:
        raise ConfigError(
            f"{' and '.join(missing)} not set; export PORTAL_URL (e.g. http://127.0.0.1:8000/) "
            "and PORTAL_TOKEN (from `manage.py issue_token <user>`), or run "
            f"`gpu-portal login`, which saves both in {config_path()}"
        )
    assert url is not None and token is not None
    return Settings(url=url, token=token)


def read_config() -> dict[str, str]:
    path = config_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {path}: {error}; run `gpu-portal login` again") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; run `gpu-portal login` again")
    return {str(key): str(value) for key, value in data.items() if isinstance(value, str)}


def write_config(*, url: str, token: str) -> Path:
    """Save the address and token, readable by the user only; returns the file's path."""
    path = config_path()
    _write_private(path, json.dumps({"url": url, "token": token}, indent=2) + "\n")
    return path


def remember_last_job(job_id: int) -> None:
    _write_private(config_path().with_name("last-job"), f"{job_id}\n")


def last_job() -> int | None:
    try:
        text = config_path().with_name("last-job").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    # Created 0600 from the start: the token is never readable by others, even for a moment.
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(text)
    os.chmod(partial, 0o600)  # an older file of that name may have had wider bits
    os.replace(partial, path)
