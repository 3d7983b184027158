"""The engine configuration: the fixed facts a prefill node is started with.

One record holds them for every part of policykit: the scheduler's node, the z3 checker, the
harness, the executor's units, and a policy's ``validate(config)``. It is built once, from the
command line or from a scenario file, and handed down whole, so a quantity has one name and
one default wherever it appears. The names are the serving engine's own (SGLang's server
arguments ``page_size``, ``chunked_prefill_size`` and ``max_prefill_tokens``, the model's
``sliding_window``), and the command-line flags are the same names with dashes.

Files and documents written before the names settled used ``swa_window`` and ``chunk_size``;
:func:`current_keys` still reads them, and everything policykit writes uses the names here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: former key -> its name now; read on input (old scenario files, check documents, unit
#: arguments), never written
FORMER_KEYS = {
    "swa_window": "sliding_window",
    "swa_windows": "sliding_windows",
    "chunk_size": "chunked_prefill_size",
}


@dataclass(frozen=True)
class EngineConfig:
    """What a prefill node is started with; a policy may validate itself against it."""

    #: tokens per KV page
    page_size: int = 64
    #: the compute budget of one round, in tokens
    chunked_prefill_size: int = 4096
    #: hybrid SWA: tokens of the sliding window; None: no sliding-window layers
    sliding_window: int | None = None
    #: the round's input budget in tokens (SGLang's ``max_prefill_tokens``); None: none
    max_prefill_tokens: int | None = None
    #: rounds a finished request holds its KV (the transfer to decode); None: the whole run.
    #: The checker searches every release timing, so a verdict never depends on it.
    kv_release_rounds: int | None = None

    @property
    def hybrid_swa(self) -> bool:
        """The model has sliding-window layers (and the node a sliding-window pool)."""
        return self.sliding_window is not None

    def to_dict(self) -> dict[str, int | None]:
        """Every field by its name: what JSON documents and unit arguments carry."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineConfig:
        """The record :meth:`to_dict` wrote (former key names accepted); other keys ignored."""
        known = current_keys(data)
        return cls(**{k: known[k] for k in cls.__dataclass_fields__ if k in known})


def current_keys(data: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with every former key name (:data:`FORMER_KEYS`) read as its name now; where
    both are present, the current one wins."""
    out = dict(data)
    for old, new in FORMER_KEYS.items():
        if old in out:
            value = out.pop(old)
            out.setdefault(new, value)
    return out
