"""LocalRedisCluster: a Redis Cluster of ``redis-server`` children on loopback (three primaries with a
replica each by default), formed with ``redis-cli --cluster create`` and ended by PID.

A node's cluster bus listens on its port + 10000, so every port picked here has that one free too
(and stays below 55535, where a bus port would not exist). The integration tests
(``tests/integration/test_state_store_cluster.py``), the chaos suite's ``redis_cluster_failover``
fault and ``aptix bench``'s shard comparison start one. Nodes keep nothing on disk
(``appendonly no``, ``save ""``); their ``nodes.conf`` lives in a folder of their own.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from aptix_cli.launcher import ManagedProcess, free_port, wait_until

__all__ = ["LocalRedisCluster", "cluster_ports"]

_BUS_OFFSET = 10000
_HIGHEST_PORT = 55535 - 1


def cluster_ports(count: int) -> list[int]:
    """``count`` free loopback ports whose bus ports (port + 10000) are free as well."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port > _HIGHEST_PORT or not _free(port + _BUS_OFFSET):
            continue
        ports.append(port)
    return ports


class LocalRedisCluster:
    """``primaries`` primaries with ``replicas`` replicas each, started by :meth:`start`, ended by :meth:`stop`.

    Args:
        log_dir: where each node's log and ``nodes.conf`` go.
        primaries: primaries (at least 3: ``redis-cli --cluster create`` asks for three).
        replicas: replicas per primary.
        node_timeout_ms: ``cluster-node-timeout``: how long a primary may be unreachable before its
            replica is promoted (the failover's detection time).
    """

    def __init__(self, log_dir: Path, *, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 2000) -> None:
        self.log_dir = log_dir
        self.primaries = primaries
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.ports = cluster_ports(primaries * (1 + replicas))
        self.nodes: dict[int, ManagedProcess] = {}
        """The running node of each port."""

    @property
    def url(self) -> str:
        """``redis+cluster://`` naming every node (``APTIX_REDIS_URL``)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def start(self, *, timeout: float = 60.0) -> None:
        """Start every node, form the cluster, and wait until every slot is served."""
        for port in self.ports:
            self.start_node(port)
        create = [
            _binary("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{port}" for port in self.ports),
            "--cluster-replicas", str(self.replicas), "--cluster-yes",
        ]  # fmt: skip
        formed = subprocess.run(create, capture_output=True, text=True, timeout=timeout, check=False)
        if formed.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {formed.stdout}{formed.stderr}")
        wait_until(list(self.nodes.values()), self.healthy, timeout)

    def start_node(self, port: int) -> ManagedProcess:
        """Start (or start again) the node on ``port``; its ``nodes.conf`` says which cluster it belongs to."""
        node_dir = self.log_dir / f"redis-cluster-{port}"
        node_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            _binary("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
            "--save", "", "--appendonly", "no", "--dir", str(node_dir), "--daemonize", "no",
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        process = ManagedProcess(f"redis-cluster-{port}", argv, env, self.log_dir, own_session=True)
        self.nodes[port] = process
        wait_until([process], lambda: _pings(port), 20)
        return process

    def client(self) -> RedisCluster:
        """A new cluster client (the caller closes it)."""
        return RedisCluster(host="127.0.0.1", port=self.ports[0], socket_timeout=5, socket_connect_timeout=2)

    def primary_ports(self) -> list[int]:
        """The ports of the nodes that are primaries now, as the first live node sees it."""
        return [port for port, role in self.roles().items() if role == "master"]

    def roles(self) -> dict[int, str]:
        """Each live node's role (``master`` or ``slave``), as it says itself."""
        roles = {}
        for port, process in self.nodes.items():
            if not process.alive():
                continue
            node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
            try:
                roles[port] = str(node.info("replication")["role"])
            except redis.RedisError:
                continue
            finally:
                node.close()
        return roles

    def replica_of(self, primary: int) -> int:
        """The port of a replica of the primary on ``primary``."""
        for port, process in self.nodes.items():
            if port == primary or not process.alive():
                continue
            node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
            try:
                info = node.info("replication")
            finally:
                node.close()
            if info.get("role") == "slave" and int(info.get("master_port", 0)) == primary:
                return port
        raise LookupError(f"no replica of the primary on port {primary}")

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port``."""
        self.nodes[port].kill(signal.SIGKILL)

    def healthy(self) -> bool:
        """Whether every live node says ``cluster_state:ok`` (every slot served)."""
        for port, process in self.nodes.items():
            if not process.alive():
                continue
            node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
            try:
                if node.cluster("info").get("cluster_state") != "ok":
                    return False
            except redis.RedisError:
                return False
            finally:
                node.close()
        return True

    def wait_promoted(self, replica: int, *, timeout: float = 60.0) -> float:
        """Wait until the node on ``replica`` is a primary and the cluster serves every slot; seconds waited."""
        began = time.monotonic()
        alive = [process for process in self.nodes.values() if process.alive()]
        wait_until(alive, lambda: self.roles().get(replica) == "master" and self.healthy(), timeout)
        return time.monotonic() - began

    def stop(self) -> None:
        """SIGKILL every node this cluster started (each by its process group), and remove their folders."""
        for process in self.nodes.values():
            process.kill(signal.SIGKILL)
        self.nodes.clear()
        for port in self.ports:
            shutil.rmtree(self.log_dir / f"redis-cluster-{port}", ignore_errors=True)


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pings(port: int) -> bool:
    node = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(node.ping())
    except redis.RedisError:
        return False
    finally:
        node.close()


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not on PATH: a local Redis Cluster needs it")
    return path
