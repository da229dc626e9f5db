"""Webhook URLs: refused at submission and again at delivery unless public; a delivery connects to the
address that was checked (a fake resolver stands in for DNS)."""

from __future__ import annotations

import ipaddress
import re

import pytest

from shared.webhooks.addresses import Target, check_endpoint, check_syntax, why_not_public
from shared.webhooks.addresses import WebhookUrlError as UrlError


class _Resolver:
    """A DNS that answers every name with ``addresses`` and remembers what it was asked."""

    def __init__(self, *addresses: str) -> None:
        self.addresses = list(addresses)
        self.calls: list[tuple[str, int]] = []

    def __call__(self, host: str, port: int) -> list[str]:
        self.calls.append((host, port))
        return self.addresses


_resolver = _Resolver


def test_a_public_host_is_pinned_to_the_address_that_was_checked() -> None:
    resolve = _resolver("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")
    target = check_endpoint("https://hooks.example.com/in?x=1#frag", allow_private=False, resolve=resolve)
    assert target == Target(
        url="https://93.184.215.14/in?x=1", host_header="hooks.example.com", sni_hostname="hooks.example.com"
    )
    assert resolve.calls == [("hooks.example.com", 443)]


def test_a_port_and_an_ipv6_address_are_kept_in_the_pinned_url() -> None:
    target = check_endpoint("http://hooks.example.com:8080/in", allow_private=False,
                            resolve=_resolver("2606:2800:21f:cb07:6820:80da:af6b:8b2c"))  # fmt: skip
    assert target.url == "http://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:8080/in"
    assert (target.host_header, target.sni_hostname) == ("hooks.example.com:8080", None)


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.0.0.7", "private"),
        ("172.16.5.4", "private"),
        ("192.168.1.1", "private"),
        ("fd00::1", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "not a public address"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),
    ],
)
def test_a_host_resolving_to_a_non_public_address_is_refused_naming_why(address: str, kind: str) -> None:
    with pytest.raises(UrlError, match=kind) as refused:
        check_endpoint("https://inside.example.com/x", allow_private=False, resolve=_resolver(address))
    assert "APTIX_WEBHOOK_ALLOW_PRIVATE" in str(refused.value)


@pytest.mark.parametrize(
    ("address", "carried", "kind"),
    [
        # 6to4 (2002::/16): the IPv4 address is bits 16-47
        ("2002:7f00:1::", "127.0.0.1", "a loopback address"),
        ("2002:a9fe:a9fe::", "169.254.169.254", "a link-local address"),
        ("2002:a00:1::1", "10.0.0.1", "a private address"),
        ("2002:6440:1::", "100.64.0.1", "not a public address"),
        # NAT64, well-known prefix (64:ff9b::/96): the last 32 bits
        ("64:ff9b::7f00:1", "127.0.0.1", "a loopback address"),
        ("64:ff9b::a9fe:a9fe", "169.254.169.254", "a link-local address"),
        ("64:ff9b::c0a8:101", "192.168.1.1", "a private address"),
        ("64:ff9b::6440:1", "100.64.0.1", "not a public address"),
        # IPv4-mapped (::ffff:0:0/96)
        ("::ffff:127.0.0.1", "127.0.0.1", "a loopback address"),
        ("::ffff:169.254.169.254", "169.254.169.254", "a link-local address"),
        ("::ffff:172.16.0.1", "172.16.0.1", "a private address"),
        ("::ffff:100.64.0.1", "100.64.0.1", "not a public address"),
        # Teredo (2001::/32): the client's address is the last 32 bits inverted
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", "127.0.0.1", "a loopback address"),
        ("2001:0:4136:e378:8000:63bf:5601:5601", "169.254.169.254", "a link-local address"),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "10.0.0.1", "a private address"),
        ("2001:0:4136:e378:8000:63bf:9bbf:fffe", "100.64.0.1", "not a public address"),
        # IPv4-compatible (::/96, deprecated)
        ("::7f00:1", "127.0.0.1", "a loopback address"),
        ("::a9fe:a9fe", "169.254.169.254", "a link-local address"),
        ("::a00:1", "10.0.0.1", "a private address"),
        ("::6440:1", "100.64.0.1", "not a public address"),
    ],
)
def test_an_ipv6_address_carrying_a_non_public_ipv4_address_is_refused_naming_it(
    address: str, carried: str, kind: str
) -> None:
    assert f"carrying {carried}, {kind}" in (why_not_public(ipaddress.ip_address(address)) or "")
    shown = re.escape(str(ipaddress.ip_address(address)))  # ::ffff:127.0.0.1 is shown as ::ffff:7f00:1
    with pytest.raises(UrlError, match=f"resolves to {shown}, which is .* carrying {carried}, {kind}"):
        check_endpoint("https://inside.example.com/x", allow_private=False, resolve=_resolver(address))
    with pytest.raises(UrlError, match=f"carrying {carried}"):
        check_endpoint(f"http://[{address}]:8080/x", allow_private=False, resolve=_resolver())


@pytest.mark.parametrize(
    "address",
    ["2002:5db8:d70e::1", "64:ff9b::5db8:d70e", "::ffff:93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"],
)
def test_a_6to4_nat64_or_mapped_address_carrying_a_public_ipv4_address_is_public(address: str) -> None:
    assert why_not_public(ipaddress.ip_address(address)) is None
    target = check_endpoint("https://hooks.example.com/in", allow_private=False, resolve=_resolver(address))
    assert target.url == f"https://[{ipaddress.ip_address(address)}]/in"


@pytest.mark.parametrize(
    ("address", "family"),
    [
        ("2001:0:4136:e378:8000:63bf:a247:28f1", "a Teredo address, never a public one (it carries 93.184.215.14)"),
        ("::5db8:d70e", "an IPv4-compatible address, never a public one (it carries 93.184.215.14)"),
        ("64:ff9b:1::5db8:d70e", "a local-use NAT64 address, never a public one"),
    ],
)
def test_teredo_ipv4_compatible_and_local_use_nat64_addresses_are_never_public(address: str, family: str) -> None:
    assert why_not_public(ipaddress.ip_address(address)) == f"is {family}"
    with pytest.raises(UrlError, match="never a public one"):
        check_endpoint(f"http://[{address}]/x", allow_private=False, resolve=_resolver())


def test_loopback_and_unspecified_ipv6_addresses_are_named_as_such_not_as_ipv4_compatible() -> None:
    assert why_not_public(ipaddress.ip_address("::1")) == "is a loopback address"
    assert why_not_public(ipaddress.ip_address("::")) == "is the unspecified address"


def test_one_private_address_among_public_ones_is_enough_to_refuse() -> None:
    with pytest.raises(UrlError, match="private"):
        check_endpoint("https://mixed.example.com/", allow_private=False,
                       resolve=_resolver("93.184.215.14", "10.0.0.1"))  # fmt: skip


def test_an_address_literal_is_checked_without_resolving() -> None:
    with pytest.raises(UrlError, match="loopback"):
        check_endpoint("http://127.0.0.1:9000/x", allow_private=False, resolve=_resolver())
    with pytest.raises(UrlError, match="link-local"):
        check_endpoint("http://[fe80::1]/x", allow_private=False, resolve=_resolver())
    assert check_endpoint("http://93.184.215.14/x", allow_private=False, resolve=_resolver()) == Target(
        url="http://93.184.215.14/x"
    )


def test_allow_private_accepts_any_address_and_resolves_nothing() -> None:
    def refuse(host: str, port: int) -> list[str]:
        raise AssertionError("no resolution with APTIX_WEBHOOK_ALLOW_PRIVATE")

    assert (
        check_endpoint("http://127.0.0.1:9000/x", allow_private=True, resolve=refuse).url == "http://127.0.0.1:9000/x"
    )
    assert check_endpoint("http://intranet.local/x", allow_private=True, resolve=refuse).host_header is None


def test_a_host_that_does_not_resolve_is_refused() -> None:
    def fail(host: str, port: int) -> list[str]:
        raise OSError(-2, "Name or service not known")

    with pytest.raises(UrlError, match="does not resolve"):
        check_endpoint("https://no-such-host.invalid/", allow_private=False, resolve=fail)
    with pytest.raises(UrlError, match="does not resolve"):
        check_endpoint("https://empty.example.com/", allow_private=False, resolve=_resolver())


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://example.com/x", "must be http or https"),
        ("javascript:alert(1)", "must be http or https"),
        ("https:///path-only", "must name a host"),
        ("https://user:pass@example.com/", "must not carry credentials"),
        ("https://example.com/a b", "spaces or control characters"),
        ("https://example.com:99999/", "not a valid URL"),
        ("https://example.com/" + "a" * 2048, "longer than 2048"),
    ],
)
def test_malformed_urls_are_refused_before_any_lookup(url: str, problem: str) -> None:
    assert problem in (check_syntax(url) or "")
    with pytest.raises(UrlError, match=problem.split(" (")[0]):
        check_endpoint(url, allow_private=True, resolve=_resolver())


def test_http_and_https_urls_with_paths_and_queries_are_fine() -> None:
    assert check_syntax("https://hooks.example.com/aptix?tenant=7") is None
    assert check_syntax("HTTP://example.com") is None
