"""The controller runtime both operators declare themselves on (controller-runtime semantics).

- ``cache``: informer-grade caches (LIST then WATCH with bookmarks, replace on re-list, named
  indexes, has-synced) and folds that aggregate a kind without storing it;
- ``queue``: the rate-limited keyed work queue (never two workers on one key; debounce);
- ``controller``: the declarative wiring of one controller and its reconcile loop;
- ``writes``: guarded, traced, write-through writes, refused when this replica does not lead;
- ``leader``: Lease leader election;
- ``manager``: caches, sync barrier, leadership, controllers, health, in one process;
- ``metrics``: controller-runtime's metric names.
"""

from shared.runtime.cache import Fold, Informer, Key, Obj, Store, key_of
from shared.runtime.controller import (
    Caches,
    Conflict,
    Controller,
    NotLeader,
    Owns,
    Result,
    TerminalError,
    Watch,
    Wiring,
    Write,
    any_change,
    generation_changed,
    labels_changed,
    spec_or_metadata_changed,
)
from shared.runtime.manager import LeaderElection, LostLeadership, Manager
from shared.runtime.writes import Writer

__all__ = [
    "Caches",
    "Conflict",
    "Controller",
    "Fold",
    "Informer",
    "Key",
    "LeaderElection",
    "LostLeadership",
    "Manager",
    "NotLeader",
    "Obj",
    "Owns",
    "Result",
    "Store",
    "TerminalError",
    "Watch",
    "Wiring",
    "Write",
    "Writer",
    "any_change",
    "generation_changed",
    "key_of",
    "labels_changed",
    "spec_or_metadata_changed",
]
