"""NetSystem: a chaos system whose gateway and workers each run on a host of their own (a network namespace).

Redis (a server of its own), PostgreSQL (the machine's, a fresh database) and the scripted model stay
in the root namespace, on 127.0.0.1; each host reaches them through its relay
(``tests.chaos.net.relay``), listening on the root side of the host's link: Redis state on 6379, the
broker on 6380 (the same server, database 1; a port of its own so that a fault can cut the broker
alone), PostgreSQL on 5432, the model on 8900. The gateway listens on its host's address, which the
harness's clients reach across the gateway host's link. :class:`NetShape` says which worker host
(always the first, ``worker1``) has a slow and lossy link or a clock ahead of the others.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from aptix_cli.launcher import ManagedProcess, answers, wait_until
from tests.chaos.backing import RedisServer
from tests.chaos.net.hosts import Host, Network
from tests.chaos.system import ChaosSystem, SystemOptions

__all__ = ["BROKER_PORT", "FAKETIME_LIBRARY", "NetShape", "NetSystem"]

logger = logging.getLogger(__name__)

REDIS_PORT = 6379
BROKER_PORT = 6380
"""The relay port of the broker on each host's link (the state Redis, database 1)."""
DATABASE_PORT = 5432
MODEL_PORT = 8900
GATEWAY_PORT = 8000
FAKETIME_LIBRARY = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
"""Debian's ``faketime`` package (``apt-get install -y faketime``): shifts one process tree's clocks."""


@dataclass(frozen=True, slots=True)
class NetShape:
    """How the hosts differ; every difference is on the first worker host (``worker1``)."""

    worker_hosts: int = 2
    slow_link_ms: float = 0.0
    """Added to every round trip across worker1's link (half each way, in its relay)."""
    loss: float = 0.0
    """Share of worker1's packets dropped, each way (iptables ``statistic``)."""
    clock_ahead_seconds: float = 0.0
    """How far worker1's wall and monotonic clocks run ahead (libfaketime)."""


class NetSystem(ChaosSystem):
    """Hosts apart: the gateway and each worker in a namespace of its own, behind a link the faults cut."""

    def __init__(self, *, fault_dir: Path, catalog: Path, options: SystemOptions, shape: NetShape) -> None:
        super().__init__(fault_dir=fault_dir, catalog=catalog, options=options)
        self.shape = shape
        self.network: Network | None = None
        self.gateway_host: Host | None = None
        self.worker_hosts: list[Host] = []
        self._host_of: dict[str, Host] = {}

    def host_of(self, worker: ManagedProcess) -> Host:
        """The host ``worker`` runs on."""
        return self._host_of[worker.name]

    def start(self) -> None:
        """Make the hosts, then start Redis, the database, the model, a relay per host, the workers, the gateway.

        Raises:
            NetworkUnavailable: no root, ``ip netns`` or ``iptables`` here.
        """
        if self.shape.clock_ahead_seconds and not Path(FAKETIME_LIBRARY).exists():
            raise RuntimeError(f"{FAKETIME_LIBRARY} is missing: apt-get install -y faketime")
        self.network = Network()
        self.gateway_host = self.network.add_host("gateway")
        self.worker_hosts = [self.network.add_host(f"worker{index + 1}") for index in range(self.shape.worker_hosts)]
        self.gateway_url = f"http://{self.gateway_host.inside}:{GATEWAY_PORT}"
        self.tool_log.touch()
        self.redis.start()
        self.database.create()
        self.start_model()
        for host in [self.gateway_host, *self.worker_hosts]:
            self._start_relay(host)
        if self.shape.loss:
            self.network.lose(self.worker_hosts[0], self.shape.loss)
        for worker in [self.spawn_worker(host) for host in self.worker_hosts]:
            self.wait_worker(worker)
        self.start_gateway()

    def host_env(self, host: Host) -> dict[str, str]:
        """The environment of an Aptix process on ``host``: every service at its relay, the clock shifted if asked."""
        env = self.env()
        database = urlsplit(self.database.url)
        user = database.netloc.rpartition("@")[0]
        netloc = f"{user}@{host.outside}:{DATABASE_PORT}" if user else f"{host.outside}:{DATABASE_PORT}"
        env.update({
            "APTIX_DATABASE_URL": urlunsplit(database._replace(netloc=netloc)),
            "APTIX_REDIS_URL": f"redis://{host.outside}:{REDIS_PORT}/0",
            "APTIX_BROKER_URL": f"redis://{host.outside}:{BROKER_PORT}/1",
            "APTIX_LLM_BASE_URL": f"http://{host.outside}:{MODEL_PORT}/v1",
            # The scripted model is reached at the link's private address, never a real provider's.
            "APTIX_LLM_LOCAL_ONLY": "0",
        })  # fmt: skip
        if self.shape.clock_ahead_seconds and self.worker_hosts and host == self.worker_hosts[0]:
            env.update({"LD_PRELOAD": FAKETIME_LIBRARY, "FAKETIME": f"+{self.shape.clock_ahead_seconds:g}s"})
        return env

    def spawn_worker(self, host: Host | None = None) -> ManagedProcess:
        """Start a worker on ``host`` (default: the first worker host with no live worker) without waiting for it."""
        if host is None:
            busy = {self._host_of[worker.name].name for worker in self.workers if worker.alive()}
            host = next(each for each in self.worker_hosts if each.name not in busy)
        name = self._name("worker")
        worker = self._spawn(name, host.run(self.worker_argv(name)), env=self.host_env(host))
        self.workers.append(worker)
        self._host_of[name] = host
        logger.info("worker %s (pid %d) on %s", name, worker.pid, host.name)
        return worker

    def start_gateway(self) -> None:
        """Start the gateway on its host, listening on the host's address, and wait for ``/healthz``."""
        host = self.gateway_host
        if host is None:
            raise RuntimeError("start() makes the gateway's host first")
        argv = [sys.executable, "-m", "aptix_cli", "gateway", "--host", host.inside, "--port", str(GATEWAY_PORT)]
        self._gateway = self._spawn(self._name("gateway"), host.run(argv), env=self.host_env(host))
        wait_until([self._gateway], lambda: answers(f"{self.gateway_url}/healthz"), 60)

    def close(self) -> None:
        """End every process, drop the database, stop Redis, then delete the hosts (namespaces and links)."""
        try:
            super().close()
        finally:
            if self.network is not None:
                self.network.close()

    def _start_relay(self, host: Host) -> None:
        """The relay on ``host``'s link: Redis (twice), PostgreSQL and the model; slow on worker1 if asked."""
        database = urlsplit(self.database.admin_url)
        assert isinstance(self.redis, RedisServer), "hosts apart run on a single Redis server"
        targets = {
            REDIS_PORT: f"127.0.0.1:{self.redis.port}",
            BROKER_PORT: f"127.0.0.1:{self.redis.port}",
            DATABASE_PORT: f"{database.hostname}:{database.port or 5432}",
            MODEL_PORT: self.model_url.removeprefix("http://"),
        }
        slow = self.shape.slow_link_ms if self.worker_hosts and host == self.worker_hosts[0] else 0.0
        argv = [sys.executable, "-m", "tests.chaos.net.relay", "--delay-ms", str(slow / 2)]
        argv += [f"{host.outside}:{port}={target}" for port, target in targets.items()]
        relay = self._spawn(f"relay-{host.name}", argv)
        wait_until([relay], lambda: "relay ready" in relay.log(), 30)
