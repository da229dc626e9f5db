"""Hot turn state: the TurnState document, its keys, the ports of the store that holds it, and the stores."""

from shared.state.memory_store import MemoryStateStore
from shared.state.redis_store import RedisStateStore
from shared.state.store import (
    BrokerPush,
    CancelFlags,
    InFlightMarkers,
    Lease,
    Release,
    StepLeases,
    StepStart,
    Timers,
    TurnStates,
)
from shared.state.turn_state import LedgerEntry, ModelRetry, OutboxEvent, Providers, TurnState

__all__ = [
    "BrokerPush", "CancelFlags", "InFlightMarkers", "Lease", "LedgerEntry", "MemoryStateStore", "ModelRetry",
    "OutboxEvent", "Providers", "RedisStateStore", "Release", "StepLeases", "StepStart", "Timers", "TurnState",
    "TurnStates",
]  # fmt: skip
