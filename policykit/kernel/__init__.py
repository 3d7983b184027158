"""The round's decisions, written once over a number domain (:mod:`policykit.kernel.domain`).

The planner decides a round on ints; the checker decides the same round on z3 terms. Both ask
the same policies the same questions, charge the same ledger and refuse the same broken
answers, so those decisions live here, one topic a module. The package is pure: it loads
neither torch nor the tensor node, so the checker can import it without them. The public
names are re-exported here, so callers write ``kernel.admission(...)``.
"""

from policykit.kernel.admission import (
    Attempt,
    Offer,
    admission,
    admits,
    afresh,
    attempt,
    load_back_swa,
)
from policykit.kernel.between import (
    WAITING_PREFIX_REFRESH_INTERVAL,
    WAITING_PREFIX_REFRESH_MAX,
    drained,
    kv_back,
    kv_due,
    reclaimable,
    refresh_due,
    starves,
    stuck,
)
from policykit.kernel.blame import ask, describe
from policykit.kernel.chunking import (
    Resumed,
    aligned_end,
    chunk,
    place,
    resume,
    tail_reserve,
    truncate,
)
from policykit.kernel.domain import FIRST_TOKENS, INT_LOGIC, IntLogic, Ints, Logic, Numbers, is_int
from policykit.kernel.idle import IdleAnswers, idle_answers
from policykit.kernel.preempting import (
    Turn,
    blocks_to_allocate,
    preempting_admit_view,
    preempting_admits,
    preempting_chunk,
    preempting_chunk_view,
    preempting_victim,
    running_turn,
    victim,
    waiting_turn,
)
from policykit.kernel.queue import (
    goes_before,
    in_queue_order,
    queue_order,
    queue_rank,
)
from policykit.kernel.swa import (
    lower_swa,
    prefix_window,
    swa_host_charge,
    swa_host_hit,
    swa_loaded,
)
from policykit.kernel.views import admit_view, chunk_view, view_swa_facts

__all__ = [
    "FIRST_TOKENS",
    "INT_LOGIC",
    "WAITING_PREFIX_REFRESH_INTERVAL",
    "WAITING_PREFIX_REFRESH_MAX",
    "Attempt",
    "IdleAnswers",
    "IntLogic",
    "Ints",
    "Logic",
    "Numbers",
    "Offer",
    "Resumed",
    "Turn",
    "admission",
    "admit_view",
    "admits",
    "afresh",
    "aligned_end",
    "ask",
    "attempt",
    "blocks_to_allocate",
    "chunk",
    "chunk_view",
    "describe",
    "drained",
    "goes_before",
    "idle_answers",
    "in_queue_order",
    "is_int",
    "kv_back",
    "kv_due",
    "load_back_swa",
    "lower_swa",
    "place",
    "preempting_admit_view",
    "preempting_admits",
    "preempting_chunk",
    "preempting_chunk_view",
    "preempting_victim",
    "prefix_window",
    "queue_order",
    "queue_rank",
    "reclaimable",
    "refresh_due",
    "resume",
    "running_turn",
    "starves",
    "stuck",
    "swa_host_charge",
    "swa_host_hit",
    "swa_loaded",
    "tail_reserve",
    "truncate",
    "victim",
    "view_swa_facts",
    "waiting_turn",
]
