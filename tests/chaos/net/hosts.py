"""Hosts on one machine: network namespaces joined to this one by veth links that the harness can cut.

Each :class:`Host` is a namespace (``ip netns``) with one veth pair: ``10.N.i.2`` inside, ``10.N.i.1``
on this (the root) namespace's side, where the host's relay (``tests.chaos.net.relay``) listens for
Redis, PostgreSQL and the model. Everything the host says to the rest of the system therefore crosses
its link, and :class:`Network` breaks the link with iptables rules inside the namespace (its own
tables, so nothing on the machine changes):

- :meth:`Network.cut`: every packet either way dropped (a partition: no reset, no error, silence);
- :meth:`Network.cut_inbound`: every packet *into* the host dropped (it can send, not receive);
- :meth:`Network.cut_port`: the packets to and from one port on the link side (one service) dropped;
- :meth:`Network.heal`: those cuts lifted;
- :meth:`Network.lose`: a share of the packets each way dropped for good (``-m statistic``; the
  kernel has no ``netem``), which TCP turns into retransmission stalls.

Cuts live in a chain of their own (``APTIX-CUT``), so healing leaves the loss rules alone.
:meth:`Network.close` deletes every namespace and veth it made, by name, also after a failure.
It needs root, ``ip netns`` and ``iptables``: :func:`require_network` says which is missing.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import random
import shutil
import subprocess
from dataclasses import dataclass

__all__ = ["NOT_RUN", "Host", "Network", "NetworkUnavailable", "require_network"]

logger = logging.getLogger(__name__)

_CUT_CHAIN = "APTIX-CUT"
NOT_RUN = "NOT RUN: the network faults (hosts apart) need root; run `make chaos-net` as root"
"""How a test of hosts apart says it did not run (``tests/conftest.py`` repeats it in the run's summary)."""


class NetworkUnavailable(RuntimeError):
    """This machine cannot run hosts apart (no root, no ``ip netns``, no ``iptables``); the message says why."""


def require_network() -> None:
    """Check that namespaces and iptables can be used here.

    Raises:
        NetworkUnavailable: saying what is missing and how to get it.
    """
    if os.geteuid() != 0:
        raise NetworkUnavailable(
            "the network faults need root (network namespaces, veth links, iptables); this runs as uid "
            f"{os.geteuid()}: run `make chaos-net` as root"
        )
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            raise NetworkUnavailable(f"`{tool}` is not installed: apt-get install -y {package}")
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        raise NetworkUnavailable(f"`ip netns` does not work here: {listed.stderr.strip()}")


@dataclass(frozen=True, slots=True)
class Host:
    """One namespace and its link."""

    name: str
    """What the harness calls it ("gateway", "worker1", ...)."""
    netns: str
    link: str
    """The veth end on the root side (its peer inside is ``<link>i``)."""
    outside: str
    """The address of the link's root side: where the host's relay listens."""
    inside: str
    """The host's own address."""

    def run(self, argv: list[str]) -> list[str]:
        """``argv`` as a command that runs inside the host (``ip netns exec`` keeps the pid)."""
        return ["ip", "netns", "exec", self.netns, *argv]


class Network:
    """The namespaces of one run; every name carries the run's tag, so two runs never collide."""

    def __init__(self) -> None:
        require_network()
        self.tag = f"ax{random.randrange(16**4):04x}"
        self._subnet = _free_subnet()
        self.hosts: list[Host] = []

    def add_host(self, name: str) -> Host:
        """Create a namespace joined to this one by a veth link with addresses, up, lo up too.

        Raises:
            subprocess.CalledProcessError: an ``ip`` command failed (what was made so far is in :attr:`hosts`).
        """
        index = len(self.hosts) + 1
        net = ipaddress.ip_network(f"10.{self._subnet}.{index}.0/24")
        host = Host(
            name=name,
            netns=f"{self.tag}-{name}",
            link=f"{self.tag}h{index}",
            outside=str(net.network_address + 1),
            inside=str(net.network_address + 2),
        )
        self.hosts.append(host)
        peer = f"{host.link}i"
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", host.netns)
        _ip("addr", "add", f"{host.outside}/24", "dev", host.link)
        _ip("link", "set", host.link, "up")
        _ip("-n", host.netns, "addr", "add", f"{host.inside}/24", "dev", peer)
        _ip("-n", host.netns, "link", "set", peer, "up")
        _ip("-n", host.netns, "link", "set", "lo", "up")
        self._iptables(host, "-N", _CUT_CHAIN)
        for hook in ("INPUT", "OUTPUT"):
            self._iptables(host, "-I", hook, "1", "-j", _CUT_CHAIN)
        logger.info("host %s: namespace %s, %s <-> %s", name, host.netns, host.outside, host.inside)
        return host

    def cut(self, host: Host) -> None:
        """Drop every packet between ``host`` and the rest, both ways (loopback inside still works)."""
        peer = f"{host.link}i"
        self._iptables(host, "-A", _CUT_CHAIN, "-i", peer, "-j", "DROP")
        self._iptables(host, "-A", _CUT_CHAIN, "-o", peer, "-j", "DROP")
        logger.info("cut %s off both ways", host.name)

    def cut_inbound(self, host: Host) -> None:
        """Drop every packet into ``host``: what it sends still arrives, no answer reaches it."""
        self._iptables(host, "-A", _CUT_CHAIN, "-i", f"{host.link}i", "-j", "DROP")
        logger.info("cut %s off inbound (it can send, not receive)", host.name)

    def cut_port(self, host: Host, port: int) -> None:
        """Drop the packets between ``host`` and ``port`` on its link's far side (one service), both ways."""
        self._iptables(host, "-A", _CUT_CHAIN, "-p", "tcp", "-d", host.outside, "--dport", str(port), "-j", "DROP")
        self._iptables(host, "-A", _CUT_CHAIN, "-p", "tcp", "-s", host.outside, "--sport", str(port), "-j", "DROP")
        logger.info("cut %s off port %d of %s", host.name, port, host.outside)

    def heal(self, host: Host) -> None:
        """Lift every cut of ``host`` (loss rules stay)."""
        self._iptables(host, "-F", _CUT_CHAIN)
        logger.info("healed %s", host.name)

    def lose(self, host: Host, probability: float) -> None:
        """Drop each packet into and out of ``host`` with ``probability``, for the rest of the run."""
        peer = f"{host.link}i"
        for hook, side in (("INPUT", "-i"), ("OUTPUT", "-o")):
            self._iptables(
                host, "-A", hook, side, peer, "-m", "statistic", "--mode", "random",
                "--probability", str(probability), "-j", "DROP",
            )  # fmt: skip
        logger.info("%s loses %.1f %% of its packets each way", host.name, probability * 100)

    def close(self) -> None:
        """Delete every namespace and root-side veth this network made (by name); errors are logged."""
        for host in reversed(self.hosts):
            for argv in (["netns", "delete", host.netns], ["link", "delete", host.link]):
                done = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
                if done.returncode != 0 and "Cannot find" not in done.stderr and "No such" not in done.stderr:
                    logger.warning("ip %s: %s", " ".join(argv), done.stderr.strip())
        self.hosts.clear()

    def _iptables(self, host: Host, *args: str) -> None:
        subprocess.run(["ip", "netns", "exec", host.netns, "iptables", "-w", *args], check=True, capture_output=True)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, ["ip", *args], done.stdout, done.stderr)


def _free_subnet() -> int:
    """A second octet N such that no address or route of this machine is in 10.N.0.0/16."""
    used = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    used += subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    candidates = [n for n in range(160, 251) if f"10.{n}." not in used]
    if not candidates:
        raise NetworkUnavailable("no free 10.N.0.0/16 between 10.160 and 10.250 for the hosts' links")
    return random.choice(candidates)
