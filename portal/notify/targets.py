"""Where a webhook may go (PORTAL_WEBHOOK_ALLOW), and a connection to exactly the address
that was checked.

A webhook URL is chosen by a user, and the portal's worker sits inside the cluster's network:
without a check, a URL could make it call the metadata service, the database or an admin
page on a private address (server-side request forgery). So by default only public
addresses are allowed; operators name internal receivers in the allow-list. The check runs
when a URL is saved (for an address written in the URL) and again before every try, on
every address its name resolves to; the connection then goes to the checked address, so a
name that resolves differently a moment later (DNS rebinding) gains nothing. Redirects are
never followed.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from portal.env import TargetAllowList
from portal.notify.models import WEBHOOK_URL_MAX_CHARS

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
URL_HELP = (
    "an http:// or https:// URL of at most 500 characters, e.g. https://hooks.example.org/gpu"
)


class TargetRefused(Exception):
    """A webhook target the allow-list does not allow (never worth a retry)."""


def url_problem(url: str, *, allow: TargetAllowList | None = None) -> str | None:
    """What is wrong with ``url`` as a webhook URL, or None; with the allowed values."""
    allow = allow or settings.WEBHOOK_ALLOW
    if not (allow.public or allow.networks or allow.hosts):
        return allowed_text(allow)
    if len(url) > WEBHOOK_URL_MAX_CHARS:
        return f"{len(url)} characters is too long; allowed: {URL_HELP}"
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return f"must not contain spaces or control characters; allowed: {URL_HELP}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"{url!r} is not a URL ({error}); allowed: {URL_HELP}"
    if parts.scheme not in ("http", "https"):
        shown = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        return f"{shown} is not allowed; allowed: {URL_HELP}"
    if not parts.hostname:
        return f"no host; allowed: {URL_HELP}"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user name or password (the body is signed instead)"
    if port == 0:
        return f"port 0 is not a port; allowed: {URL_HELP}"
    host = parts.hostname.lower()
    try:
        address: Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None:
        problem = address_problem(host, address, allow)
        if problem is not None:
            return problem
    elif (host == "localhost" or host.endswith(".localhost")) and not host_listed(host, allow):
        return f"{host} is this machine; {allowed_text(allow)}"
    return None


def host_listed(host: str, allow: TargetAllowList) -> bool:
    host = host.lower().rstrip(".")
    return any(
        host == entry or (entry.startswith(".") and (host.endswith(entry) or host == entry[1:]))
        for entry in allow.hosts
    )


def address_problem(host: str, address: Address, allow: TargetAllowList) -> str | None:
    """Why the portal may not send to ``address`` (which ``host`` names), or None."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if host_listed(host, allow) or any(address in network for network in allow.networks):
        return None
    if allow.public and address.is_global and not address.is_multicast:
        return None
    kind = next(
        (
            name
            for name, flag in (
                ("loopback", address.is_loopback),
                ("link-local", address.is_link_local),
                ("private", address.is_private),
                ("multicast", address.is_multicast),
                ("unspecified", address.is_unspecified),
                ("reserved", address.is_reserved),
            )
            if flag
        ),
        "public" if address.is_global else "not public",
    )
    return f"{address} is a {kind} address; {allowed_text(allow)}"


def allowed_text(allow: TargetAllowList) -> str:
    parts = ["any public address"] if allow.public else []
    parts += [str(network) for network in allow.networks] + list(allow.hosts)
    if not parts:
        return "no webhook target is allowed here (PORTAL_WEBHOOK_ALLOW=none)"
    return f"allowed: {', '.join(parts)} (PORTAL_WEBHOOK_ALLOW)"


def resolve_allowed(host: str, port: int) -> Address:
    """The first address ``host`` resolves to that the allow-list allows; raises
    ``TargetRefused`` naming the refused ones, or ``OSError`` when the name does not resolve."""
    allow = settings.WEBHOOK_ALLOW
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        candidates = [literal]
    else:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        candidates = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    problems = []
    for address in candidates:
        problem = address_problem(host, address, allow)
        if problem is None:
            return address
        problems.append(problem)
    raise TargetRefused(f"{host}: " + "; ".join(dict.fromkeys(problems)))


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to ``address``, with ``host`` in the Host header."""

    def __init__(self, host: str, port: int, *, address: Address, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = str(address)

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to ``address``, the certificate checked against ``host`` (SNI too)."""

    def __init__(self, host: str, port: int, *, address: Address, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = str(address)

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self.host)


def post(url: str, *, body: bytes, headers: dict[str, str], timeout: float) -> tuple[int, str]:
    """POST ``body`` to ``url`` at an allowed address; returns (status, start of the reply).

    Raises ``TargetRefused`` for a target the allow-list refuses, ``OSError`` (and
    ``http.client.HTTPException``) when the receiver cannot be reached or answers nonsense.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    address = resolve_allowed(host, port)
    cls: Any = _PinnedHTTPSConnection if secure else _PinnedHTTPConnection
    connection = cls(host, port, address=address, timeout=timeout)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        reply = response.read(512).decode("utf-8", "replace")
        return response.status, reply
    finally:
        connection.close()
