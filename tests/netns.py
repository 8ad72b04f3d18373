"""`HostNetwork`: a private network of separate hosts, one Linux network namespace each.

    with HostNetwork(["h1", "h2", "h3"]) as net:
        net.broker_address           # the root namespace's address on that network
        net.hosts[0].address         # host h1's own address
        [*net.hosts[0].enter, "python", "-m", "workers"]   # a command run on host h1

Topology: one bridge in the root namespace carries `broker_address`; each host is a
namespace with a veth pair: one end enslaved to the bridge, the other moved into the
namespace with the host's address. So every host reaches the broker (a server in the root
namespace bound to `broker_address`) and the other hosts (a future gang's rendezvous at
`MASTER_ADDR`), all over the bridge; the root namespace forwards nothing (a bridge is layer
2: no `ip_forward`, no NAT, no firewall rule is touched).

Addresses, chosen on purpose: a /24 of 198.18.0.0/15, the block set aside for network
benchmark tests (RFC 2544; IANA's special-purpose registry). It is never routed on the
Internet and no LAN, VPN or cloud network hands it out, and the /24 is taken only when no
address or route of this machine already covers any of it, so it exists only on these
links. Loopback addresses (127.x) on veths were the other option: they need `route_localnet`
on every interface, and in the root namespace the local route 127.0.0.0/8 on `lo` wins, so a
127.x broker address would be delivered to `lo` and never cross a veth. Each namespace gets
its own `lo` and the /24's connected route and nothing else: no default route, so from inside
it only the test's own addresses can be reached (`routes()` says so; the test checks it).
Every link has IPv6 switched off, so not even a link-local router solicitation leaves it.

Names are unique per instance (`portal-<id>-<host>` for namespaces, `pg<id>...` for
interfaces, at most 15 characters), and the /24 is picked under a lock file, so two runs on
one machine never collide. On exit, also after a failure half-way through the set-up, every
namespace (and with it its veth end) and every root-side link is deleted.

Commands enter a host with `nsenter --net=...`, which switches the network namespace only:
`ip netns exec` would also give them a mount namespace with a fresh /sys, hiding the cgroup v2
hierarchy the process launcher limits its jobs with.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

BENCHMARK_BLOCK = ipaddress.ip_network("198.18.0.0/15")
LOCK_FILE = Path(tempfile.gettempdir()) / "portal-test-netns.lock"
IP_TIMEOUT_S = 20


class NetnsError(RuntimeError):
    """A namespace or link could not be made; the message has the command and its error."""


def ip(*args: str, check: bool = True) -> str:
    """Run `ip <args>` (iproute2) and return its output."""
    done = subprocess.run(  # noqa: S603 - our own argv
        ["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S
    )
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def why_not_possible() -> str | None:
    """None when this process can make network namespaces; otherwise why not."""
    for tool, package in (("ip", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return (
                f"`{tool}` is missing (Debian package {package}; `make test` installs it as root)"
            )
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); this runs as a user"
    probe = f"portal-probe-{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
    except (NetnsError, OSError, subprocess.TimeoutExpired) as error:
        return f"cannot make a network namespace (no CAP_NET_ADMIN?): {error}"
    ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Host:
    name: str
    namespace: str
    address: str  # its own address on the test's network
    link: str  # the root-side end of its veth pair

    @property
    def enter(self) -> tuple[str, ...]:
        """The argv prefix that runs a command on this host (in its network namespace)."""
        return ("nsenter", f"--net=/run/netns/{self.namespace}", "--")

    def routes(self) -> list[str]:
        """Every IPv4 route of this host, all tables: what it can reach at all."""
        text = ip("-n", self.namespace, "-4", "route", "show", "table", "all")
        return [line.strip() for line in text.splitlines() if line.strip()]


class HostNetwork:
    """Context manager; see the module docstring."""

    def __init__(self, names: Sequence[str]) -> None:
        if not names or len(set(names)) != len(names):
            raise ValueError(f"names: distinct host names needed, got {list(names)!r}")
        self.id = secrets.token_hex(2)
        self.names = list(names)
        self.bridge = f"pg{self.id}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self.broker_address = ""
        self.hosts: list[Host] = []
        self._made_namespaces: list[str] = []
        self._made_links: list[str] = []

    def __enter__(self) -> HostNetwork:
        try:
            with _lock():
                self.subnet = free_subnet()
                # The bridge takes the subnet's address at once: the next run sees it taken.
                self._link("add", self.bridge, "type", "bridge")
                self.broker_address = str(self.subnet[1])
                ip("addr", "add", f"{self.broker_address}/24", "dev", self.bridge)
            _no_ipv6(self.bridge)
            ip("link", "set", self.bridge, "up")
            for index, name in enumerate(self.names):
                self.hosts.append(self._add_host(index, name))
        except BaseException:
            self.close()
            raise
        return self

    def _link(self, *args: str) -> None:
        ip("link", *args)
        self._made_links.append(args[1])

    def _add_host(self, index: int, name: str) -> Host:
        assert self.subnet is not None
        namespace = f"portal-{self.id}-{name}"
        ip("netns", "add", namespace)
        self._made_namespaces.append(namespace)
        outside, inside = f"pg{self.id}h{index}", f"pg{self.id}n{index}"
        self._link("add", outside, "type", "veth", "peer", "name", inside)
        _no_ipv6(outside)
        ip("link", "set", outside, "master", self.bridge, "up")
        ip("link", "set", inside, "netns", namespace)
        address = str(self.subnet[11 + index])
        in_ns = ("-n", namespace)
        # IPv6 off inside too: /proc/sys/net is the namespace's own for a process in it.
        off = "for n in ('all', 'default'): open(f'/proc/sys/net/ipv6/conf/{n}/disable_ipv6', 'w').write('1')"
        done = subprocess.run(  # noqa: S603 - our own argv
            ["nsenter", f"--net=/run/netns/{namespace}", "--", sys.executable, "-c", off],
            capture_output=True, text=True, timeout=IP_TIMEOUT_S, check=False,
        )  # fmt: skip
        if done.returncode != 0 and Path("/proc/sys/net/ipv6").exists():
            raise NetnsError(f"cannot switch IPv6 off in {namespace}: {done.stderr.strip()}")
        ip(*in_ns, "link", "set", "lo", "up")
        ip(*in_ns, "addr", "add", f"{address}/24", "dev", inside)
        ip(*in_ns, "link", "set", inside, "up")
        return Host(name=name, namespace=namespace, address=address, link=outside)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Delete everything this instance made; safe to call more than once."""
        for namespace in reversed(self._made_namespaces):
            ip("netns", "del", namespace, check=False)
        self._made_namespaces.clear()
        # A veth's root-side end went with its peer's namespace; `del` of a gone link fails
        # harmlessly. The bridge last.
        for link in reversed(self._made_links):
            if _link_exists(link):
                ip("link", "del", link, check=False)
        self._made_links.clear()

    def leftovers(self) -> list[str]:
        """What of this instance still exists (for a test that checks the clean-up)."""
        names = {entry.split()[0] for entry in ip("netns", "list").splitlines() if entry}
        left = [n for n in names if n.startswith(f"portal-{self.id}-")]
        left += [link for link in _link_names() if link.startswith(f"pg{self.id}")]
        return sorted(left)


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of 198.18.0.0/15 that no address or route of this machine overlaps."""
    taken = list(_used_networks())
    candidates = list(BENCHMARK_BLOCK.subnets(new_prefix=24))
    # A random start: parallel runs that did not share the lock file still rarely meet.
    start = secrets.randbelow(len(candidates))
    for subnet in candidates[start:] + candidates[:start]:
        if not any(subnet.overlaps(used) for used in taken):
            return subnet
    raise NetnsError(f"every /24 of {BENCHMARK_BLOCK} is in use on this machine")


def _used_networks() -> Iterator[ipaddress.IPv4Network]:
    for entry in json.loads(ip("-j", "-4", "addr", "show") or "[]"):
        for info in entry.get("addr_info", []):
            yield ipaddress.ip_network(f"{info['local']}/{info['prefixlen']}", strict=False)
    for entry in json.loads(ip("-j", "-4", "route", "show", "table", "all") or "[]"):
        dst = entry.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                yield ipaddress.ip_network(dst, strict=False)


def _link_names() -> list[str]:
    return [entry["ifname"] for entry in json.loads(ip("-j", "link", "show") or "[]")]


def _link_exists(name: str) -> bool:
    return name in _link_names()


def _no_ipv6(link: str) -> None:
    path = Path(f"/proc/sys/net/ipv6/conf/{link}/disable_ipv6")
    with contextlib.suppress(OSError):
        path.write_text("1")


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
