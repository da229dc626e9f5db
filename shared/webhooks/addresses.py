"""Webhook endpoints: which URLs Aptix POSTs events to, checked when a request names one and again at
each delivery.

A URL must be ``http`` or ``https``, name a host and carry no credentials (a webhook authenticates
by its signature). Unless ``APTIX_WEBHOOK_ALLOW_PRIVATE=1`` (tests, development), every address its
host resolves to must be public: a private, loopback, link-local, shared (100.64.0.0/10), multicast,
reserved or unspecified address is refused, so a client cannot make Aptix call services inside its
network. An IPv6 address that carries an IPv4 address (IPv4-mapped ``::ffff:0:0/96``, 6to4
``2002::/16``, NAT64 ``64:ff9b::/96``) is judged by the IPv4 address it carries; Teredo
(``2001::/32``), IPv4-compatible (``::/96``) and local-use NAT64 (``64:ff9b:1::/48``) addresses are
never public (RFC 6890, RFC 8215) and are refused naming what they carry. A delivery connects to
the very address it checked (:class:`Target`): a DNS answer that changes between the check and the
connection (DNS rebinding) cannot point it elsewhere.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = [
    "MAX_URL_LENGTH",
    "Resolver",
    "Target",
    "WebhookUrlError",
    "check_endpoint",
    "check_syntax",
    "why_not_public",
]

MAX_URL_LENGTH = 2048
"""Longest webhook URL accepted."""

Resolver = Callable[[str, int], list[str]]
"""Host name and port -> the addresses it resolves to (tests pass a fake)."""

_IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")


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


def why_not_public(address: _IpAddress) -> str | None:
    """Why a webhook may not be sent to ``address``, or None when it is public.

    An IPv6 address that carries an IPv4 address is judged by that address: IPv4-mapped, 6to4 and
    NAT64 (``64:ff9b::/96``) addresses are public when the IPv4 address they carry is; Teredo,
    IPv4-compatible and local-use NAT64 addresses never are (whatever they carry). Reads nothing else.

    Args:
        address: the address a host names or resolves to.

    Returns:
        What the address is, phrased to follow the address ("is a loopback address", "is a 6to4
        address carrying 127.0.0.1, a loopback address"), or None.
    """
    if isinstance(address, ipaddress.IPv6Address) and not (address.is_loopback or address.is_unspecified):
        carried = _carried_ipv4(address)
        if carried is not None:
            family, inner, ever_public = carried
            if inner is None:
                return f"is {family} address, never a public one"
            if not _is_public(inner):
                return f"is {family} address carrying {inner}, {_kind(inner)}"
            return None if ever_public else f"is {family} address, never a public one (it carries {inner})"
    return None if _is_public(address) else f"is {_kind(address)}"


def _carried_ipv4(address: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address | None, bool] | None:
    """The family of an IPv6 address that carries an IPv4 address, the IPv4 address (None when its
    place is the network's choice) and whether an address of the family can be public; None for
    any other IPv6 address."""
    if address.ipv4_mapped is not None:
        return "an IPv4-mapped", address.ipv4_mapped, True
    if address.sixtofour is not None:
        return "a 6to4", address.sixtofour, True
    if address.teredo is not None:
        return "a Teredo", address.teredo[1], False  # the client's address, stored inverted
    if address in _NAT64:
        return "a NAT64", ipaddress.IPv4Address(int(address) & 0xFFFFFFFF), True
    if address in _NAT64_LOCAL:
        return "a local-use NAT64", None, False  # RFC 8215: where the IPv4 address sits is the network's choice
    if address in _IPV4_COMPATIBLE:
        return "an IPv4-compatible", ipaddress.IPv4Address(int(address)), False  # deprecated, RFC 4291
    return None


def _is_public(address: _IpAddress) -> bool:
    return address.is_global and not (address.is_multicast or address.is_reserved or address.is_unspecified)


def _require_public(address: _IpAddress, host: str) -> None:
    problem = why_not_public(address)
    if problem is None:
        return
    named = host if host == str(address) else f"{host!r} resolves to {address}, which"
    raise WebhookUrlError(
        f"{named} {problem}: webhooks go to public addresses only "
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
