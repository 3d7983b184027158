"""Between rounds: when the KV a finished request holds comes back.

Written once for SGLang's node, the node that preempts and both checker models, which used to
state it each their own way (one at the start of a round, one at the end of the round before,
one of them as ``finished + delay - 1 <= r``)."""

from __future__ import annotations

from typing import Any


def kv_back(finished: Any, delay: Any, round_no: Any) -> Any:
    """Whether the KV of a request that finished in round ``finished``, its transfer to decode
    taking ``delay`` rounds, is free for round ``round_no`` to plan with. SGLang's node frees it
    as that round starts, the node that preempts as the round before ends (asking for
    ``round_no + 1``), so both give it back to round ``finished + delay``, and to the next round
    where ``delay`` is 0 or 1. Numbers of any kind: ints, or terms (the checker's models)."""
    return finished + delay <= round_no
