"""Hybrid SWA with a host-tier hit: the sliding-window KV a load-back takes, and what a lock's
window makes unevictable. Kept apart so the views, the admission and the idle test charge
the same."""

from __future__ import annotations

from typing import Any

from policykit.kernel.domain import is_int
from policykit.ledger import Ledger, minimum
from policykit.pages import ceil_paged


def prefix_window(tokens: Any, window: int, page: int) -> Any:
    """The live sliding-window KV of a cached page-aligned prefix of ``tokens`` laid out by
    :func:`~policykit.swa_cache.window_start`: its last window in whole pages, or all of it
    when shorter. Plain arithmetic (``tokens - window_start(tokens)`` for page multiples): the
    checker's round model lays a scenario's prefixes out with it too."""
    return minimum(tokens, ceil_paged(window, page))


def swa_host_hit(loaded: Any, window: int | None, page: int) -> Any:
    """SGLang 0.5.23's ``swa_host_hit_length`` for a host hit that loads back ``loaded``
    tokens (hybrid SWA): the sliding-window KV that comes back with it, which takes
    sliding-window slots at admission. 0.5.23 derives it in its tree walk
    (``SWAComponent.finalize_match_result_in_tree_core``): from the end of the hit towards the
    root, it counts the host-only nodes' sliding-window KV until a window is covered. A host
    run is backed up as its insert left it on the device: a leaf cut where its last window of
    whole pages begins, the part above it a tombstone for the window (the KV out of a
    request's window is freed as it runs). So the walk ends at that last part: the hit's last
    window in whole pages, or the whole hit if shorter. Ints and the checker's terms alike."""
    if window is None:
        return loaded
    return prefix_window(loaded, window, page)


def swa_host_charge(host: Any, window: int | None, page: int) -> Any:
    """Sliding-window slots a load-back of ``host`` tokens takes (hybrid SWA): the hit's
    sliding-window KV (``swa_host_hit``) in whole pages. The hit is rounded up first: its
    last window is then whole pages already, and the checker's terms need no quotient of a
    capped value."""
    return swa_host_hit(ceil_paged(host, page), window, page)


def swa_loaded(ledger: Ledger, swa_pool: Any | None, host: Any) -> tuple[Ledger, Any]:
    """The sliding-window budget as a request whose host hit loads back ``host`` tokens sees
    it: the ledger and the pool less the hit's sliding-window KV (:func:`swa_host_charge`).

    SGLang 0.5.23's ``SWAPrefillBudget`` adds that charge to the chunk's estimate
    (``estimate_swa_kv_tokens(host_hit_length=swa_host_hit_length)``) in the fit check
    (``need + charge < remaining``), the never-fits test (``need + charge >= pool``) and the
    capped chunk's headroom; taking it off the budget instead says the same, and tells a
    policy what is left once the load-back has taken it. Unchanged without hybrid SWA or a hit.
    """
    if swa_pool is None or ledger.swa_baseline is None or (is_int(host) and host == 0):
        return ledger, swa_pool
    charge = swa_host_charge(host, ledger.sliding_window, ledger.page_size)
    out = ledger.copy()
    out.swa_baseline = out.swa_baseline - charge
    return out, swa_pool - charge


def lower_swa(ledger: Ledger, tokens: Any) -> None:
    """A lock's window makes ``tokens`` of cached sliding-window KV unevictable: SGLang's
    ``remaining_swa`` counts evictable sliding-window KV as room, so it loses them."""
    if ledger.swa_baseline is not None and not (is_int(tokens) and tokens == 0):
        ledger.swa_baseline = ledger.swa_baseline - tokens
