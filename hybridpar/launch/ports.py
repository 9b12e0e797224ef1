"""Addresses of cluster tasks: ``host:port`` parsing and free local ports (pure Python)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping, Sequence

from hybridpar.launch.tasks import UsageError

DEFAULT_HOST = "127.0.0.1"


def format_address(host: str, port: int) -> str:
    """``host:port``, with IPv6 hosts in brackets (``[::1]:2222``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str, flag: str = "address") -> str:
    """Validates one ``host:port`` (IPv6 as ``[::1]:2222``) and returns it stripped.

    Raises:
        UsageError: for a missing host or port, or a port outside 1..65535.
    """
    item = text.strip()
    hint = f"Expected host:port with a port in 1..65535, e.g. 10.0.0.1:2222. Received: {flag} "
    if item.startswith("["):
        host, sep, rest = item[1:].partition("]")
        ok = sep and rest.startswith(":")
        port_text = rest[1:] if ok else ""
    else:
        host, sep, port_text = item.rpartition(":")
        ok = sep and ":" not in host
    if not ok or not host:
        raise UsageError(f"{text!r} is not host:port. {hint}{text!r}.")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UsageError(f"{text!r} has an invalid port {port_text!r}. {hint}{text!r}.")
    return item


def parse_address_list(text: str, flag: str) -> list[str]:
    """Parses a comma-separated ``host:port`` list given to ``flag``.

    Raises:
        UsageError: for an empty list or item, or a malformed address.
    """
    items = text.split(",")
    if not text.strip() or any(not item.strip() for item in items):
        raise UsageError(
            f"{flag} expects a comma-separated list of host:port without empty items, "
            f"e.g. {flag} 10.0.0.1:2222,10.0.0.2:2222. Received: {flag} {text!r}."
        )
    return [parse_address(item, flag) for item in items]


def check_unique_addresses(cluster: Mapping[str, Sequence[str]]) -> None:
    """Raises UsageError when two tasks share one ``host:port``."""
    seen: dict[str, str] = {}
    for job, addresses in cluster.items():
        for index, address in enumerate(addresses):
            if address in seen:
                raise UsageError(
                    f"{address} is given to both {seen[address]} and {job}:{index}; every task "
                    f"needs its own host:port."
                )
            seen[address] = f"{job}:{index}"



def _bind_free_port() -> int:
    """A port the OS reports free on TCP (used when portpicker is not installed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def pick_ports(
    count: int,
    exclude: Iterable[int] = (),
    pick: Callable[[], int] | None = None,
) -> list[int]:
    """``count`` distinct free ports, none of them in ``exclude``.

    ``pick`` defaults to ``portpicker.pick_unused_port`` (the ``test`` extra), else
    a port bound with port 0 and released.
    """
    if pick is None:
        try:
            import portpicker
        except ImportError:
            pick = _bind_free_port
        else:
            pick = portpicker.pick_unused_port
    excluded = set(exclude)
    ports: list[int] = []
    for _ in range(count * 50):
        if len(ports) == count:
            break
        port = pick()
        if port not in excluded and port not in ports:
            ports.append(port)
    if len(ports) != count:
        raise RuntimeError(f"could not find {count} distinct free ports (found {ports}).")
    return ports


