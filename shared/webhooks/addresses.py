"""Webhook endpoints: which URLs Aptix POSTs events to, checked when a request names one and again at
each delivery.

A URL must be ``http`` or ``https``, name a host and carry no credentials (a webhook authenticates
by its signature). Unless ``APTIX_WEBHOOK_ALLOW_PRIVATE=1`` (tests, development), every address its
host resolves to must be public: a private, loopback, link-local, shared (100.64.0.0/10), multicast,
reserved or unspecified address is refused, so a client cannot make Aptix call services inside its
network. A delivery connects to the very address it checked (:class:`Target`): a DNS answer that
changes between the check and the connection (DNS rebinding) cannot point it elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = ["MAX_URL_LENGTH", "Resolver", "Target", "WebhookUrlError", "check_endpoint", "check_syntax"]

MAX_URL_LENGTH = 2048
"""Longest webhook URL accepted."""

Resolver = Callable[[str, int], list[str]]
"""Host name and port -> the addresses it resolves to (tests pass a fake)."""

_IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class WebhookUrlError(ValueError):
    """A webhook URL Aptix will not call; the message says why, for the client."""


@dataclass(frozen=True, slots=True)
class Target:
    """Where a delivery connects: the URL to request and, when it names a checked address instead of
    the host name, the ``Host`` header and TLS server name of the original URL."""

    url: str
    host_header: str | None = None
    sni_hostname: str | None = None


def check_syntax(url: str) -> str | None:
    """What is wrong with ``url`` as a webhook URL before any name is resolved, or None.

    Args:
        url: the URL.

    Returns:
        The problem, phrased to follow "the URL" ("must be http or https"), or None when it is fine.
    """
    if len(url) > MAX_URL_LENGTH:
        return f"is longer than {MAX_URL_LENGTH} characters"
    if any(char.isspace() or ord(char) < 32 or ord(char) == 127 for char in url):
        return "must not contain spaces or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port out of range
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme.lower() not in {"http", "https"}:
        return "must be http or https"
    if not parts.hostname:
        return "must name a host"
    if parts.username is not None or parts.password is not None:
        return "must not carry credentials (a receiver authenticates a webhook by its signature)"
    return None


def check_endpoint(url: str, *, allow_private: bool, resolve: Resolver | None = None) -> Target:
    """Check ``url`` as a webhook endpoint and say where to connect.

    Args:
        url: the endpoint.
        allow_private: accept any address (``APTIX_WEBHOOK_ALLOW_PRIVATE``); the host name is then
            not resolved here.
        resolve: the resolver (default: the system's, ``getaddrinfo``).

    Returns:
        The target: the URL itself for an address literal or with ``allow_private``, else the URL
        with the first checked address in place of the host name.

    Raises:
        WebhookUrlError: the URL is malformed, its host does not resolve, or it resolves to an
            address that is not public.
    """
    problem = check_syntax(url)
    if problem is not None:
        raise WebhookUrlError(f"the URL {problem}")
    parts = urlsplit(url)
    host = parts.hostname or ""
    if allow_private:
        return Target(url=url)
    literal = _address(host)
    if literal is not None:
        _require_public(literal, host)
        return Target(url=url)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    try:
        found = (resolve or _system_resolver)(host, port)
    except (OSError, UnicodeError) as exc:
        raise WebhookUrlError(f"the host {host!r} does not resolve ({exc})") from exc
    addresses = [address for address in (_address(text) for text in found) if address is not None]
    if not addresses:
        raise WebhookUrlError(f"the host {host!r} does not resolve to any address")
    for address in addresses:
        _require_public(address, host)
    return Target(
        url=_with_host(parts, addresses[0]),
        host_header=parts.netloc,
        sni_hostname=host if parts.scheme.lower() == "https" else None,
    )


def _require_public(address: _IpAddress, host: str) -> None:
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    checked = mapped or address
    if checked.is_global and not (checked.is_multicast or checked.is_reserved or checked.is_unspecified):
        return
    named = host if host == str(address) else f"{host!r} resolves to {address}, which"
    raise WebhookUrlError(
        f"{named} is {_kind(checked)}: webhooks go to public addresses only "
        "(APTIX_WEBHOOK_ALLOW_PRIVATE=1 allows others, for tests and development)"
    )


def _kind(address: _IpAddress) -> str:
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if address.is_unspecified:
        return "the unspecified address"
    if address.is_private:
        return "a private address"
    return "not a public address"


def _address(text: str) -> _IpAddress | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # an IPv6 zone ("fe80::1%eth0") is not part of it
    except ValueError:
        return None


def _with_host(parts: SplitResult, address: _IpAddress) -> str:
    host = f"[{address}]" if address.version == 6 else str(address)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


def _system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))
