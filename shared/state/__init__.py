"""Hot turn state: the TurnState document, its keys, and the stores that hold it."""

from shared.state.memory_store import MemoryStateStore
from shared.state.redis_store import RedisStateStore
from shared.state.store import Lease, StateStore, StepStart
from shared.state.turn_state import LedgerEntry, ModelRetry, OutboxEvent, Providers, TurnState

__all__ = [
    "Lease", "LedgerEntry", "MemoryStateStore", "ModelRetry", "OutboxEvent", "Providers", "RedisStateStore",
    "StateStore", "StepStart", "TurnState",
]  # fmt: skip
