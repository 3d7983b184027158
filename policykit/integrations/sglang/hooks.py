"""The decision hooks on SGLang 0.5.23's ``PrefillAdder``, and the targets they patch.

Three methods of ``sglang.srt.managers.schedule_policy.PrefillAdder`` carry every prefill
decision policykit models but the queue's order (:mod:`.order` hooks that); the plugin wraps
exactly those (``AROUND`` / ``AFTER`` hooks through SGLang's ``HookRegistry``) and leaves the
rest of the scheduler alone:

``_select_prefill_admission`` (AROUND)
    A waiting request's shape: the admission check (:meth:`AdmissionPolicy.admit`), its chunk
    length (:meth:`ChunkingPolicy.new_chunk`) and where a truncated chunk ends
    (:meth:`AlignmentPolicy.align_end`, which replaces upstream's ``truncation_align_size``).
    Upstream calls it with the request's prefix already locked, so ``rem_total_tokens`` is the
    post-lock figure policykit's planner checks the second time.
``_commit_prefill_admission`` (AFTER)
    The tail reservation of a truncated new request (:meth:`AdmissionPolicy.tail_reserve`),
    added to the budget's ``total_offset`` (promised to later rounds, not allocated now).
``add_chunked_req`` (AROUND)
    The in-progress request's resume length, or its deferral (:meth:`ChunkingPolicy.resume_chunk`
    returning 0 parks it, as upstream's hybrid-SWA budget already does), the alignment of a
    resumed chunk that is truncated again, and its tail reservation. The length reaches
    upstream's own code through ``chunked_req_limit``, so a policy can shorten or defer the
    resumed chunk but never lengthen it past upstream's budget.

Where upstream's budget models more than policykit's views do -- hybrid SWA or Mamba pools,
DLLM, sharded KV, encoder replay, chunked prefill disabled, AMD exact-chunk-fill -- the hooks
hand the call to upstream unchanged (:func:`plain`). A policy that raises or answers nonsense
is logged by :mod:`.guard` and upstream decides that one call: the request's whole admission
shape, the resumed chunk, or (for a tail) no reservation, which is upstream's own rule.
"""

from __future__ import annotations

import math
from functools import cache
from types import ModuleType
from typing import Any

from policykit.integrations.sglang import guard
from policykit.integrations.sglang.guard import FALLBACK
from policykit.integrations.sglang.views import admit_view, chunk_view
from policykit.kernel import Ints
from policykit.registry import Combo

ADDER = "sglang.srt.managers.schedule_policy.PrefillAdder"
SELECT = f"{ADDER}._select_prefill_admission"
COMMIT = f"{ADDER}._commit_prefill_admission"
RESUME = f"{ADDER}.add_chunked_req"
#: ``PrefillAdder``'s targets, in the order the scheduler meets them in a round
DECISION_TARGETS = (RESUME, SELECT, COMMIT)

#: set on an adder whose in-progress request stays in progress this round (parked or truncated)
HOLDS_CHUNK = "policykit_holds_chunk"
#: set on an adder once: what :func:`_facts` found about its budget
FACTS = "policykit_facts"
#: upstream's schedule policy that never truncates beside an in-progress request
SPF = "shortest-prefill-first"

#: the combo the hooks ask, and its int domain (:class:`~policykit.kernel.Ints`)
_active: dict[str, Any] = {}


def activate(combo: Combo | None) -> None:
    """Make ``combo`` the one the hooks ask (``None``: the hooks pass every call through)."""
    _active.clear()
    if combo is not None:
        _active["combo"], _active["domain"] = combo, Ints(combo)


def active() -> Combo | None:
    return _active.get("combo")


@cache
def _upstream() -> ModuleType:
    import sglang.srt.managers.schedule_policy as schedule_policy

    return schedule_policy


@cache
def _single_pool_budget() -> type:
    from sglang.srt.mem_cache.prefill_budget import PrefillBudget

    return PrefillBudget


def plain(adder: Any) -> bool:
    """Whether ``adder``'s budget is the single token pool policykit's ledger models."""
    return _facts(adder)[0]


def _facts(adder: Any) -> tuple[bool, bool, bool]:
    """``(plain, replays, tiles)`` for ``adder``: whether its budget is the single pool policykit
    models, whether encoder-SWA replay is on (upstream's ``_replay_len`` is 0 when it is off),
    and whether AMD's prefill tile budget is (``_check_prefill_tile_budget`` admits everything
    when it is not). All three are fixed when upstream builds the adder, once per round, so
    they are worked out at the adder's first decision and kept on it: the decisions after it
    skip questions whose answer cannot differ."""
    facts = adder.__dict__.get(FACTS)
    if facts is None:
        sp = _upstream()
        plain = (
            adder.rem_chunk_tokens is not None
            and type(adder.memory_budget) is _single_pool_budget()
            and adder.dllm_config is None
            and not adder.is_hybrid_swa
            and not adder.is_hybrid_ssm_cache
            and not adder._mamba_slot_cost
            and not adder.kv_shard_granule
            and not adder.exact_chunk_fill
            and adder.mamba_chunk_grid <= 1
        )
        replays = bool(sp.get_exec().features.enable_encoder_swa_bounded_replay)
        # upstream's own gate (its names; an unknown layout keeps asking it)
        tiles = getattr(sp, "_IS_HIP", True) and getattr(sp, "PREFILL_TILE_BUDGET", 1) > 0
        facts = adder.__dict__[FACTS] = (plain, replays, bool(tiles))
    return facts


def _max_new(req: Any) -> int:
    """What upstream reserves for the tokens a request will generate (``add_one_req``'s rule)."""
    left = max(req.sampling_params.max_new_tokens - len(req.output_ids), 0)
    return min(left, _upstream().CLIP_MAX_NEW_TOKENS)


def _chunk_view(adder: Any, remaining: int, rem_total: float) -> Any:
    rem_total = int(rem_total)
    return chunk_view(
        remaining_tokens=remaining,
        rem_chunk_tokens=adder.rem_chunk_tokens,
        rem_total_tokens=rem_total,
        rem_swa_tokens=rem_total,
        page_size=adder.page_size,
        hybrid_swa=False,
    )


def _align(domain: Ints, adder: Any, req: Any, start: int, end: int) -> Any:
    return guard.aligned_end(domain, start, end, adder.page_size, req)


def _reserve_tail(domain: Ints, adder: Any, req: Any, tail: int) -> None:
    reserve = guard.tail_reserve(domain, tail, _max_new(req), adder.page_size, req)
    if reserve is not FALLBACK:
        adder.memory_budget.total_offset += reserve


def select_admission(original: Any, adder: Any, req: Any, **kwargs: Any) -> Any:
    """AROUND ``_select_prefill_admission``: the policies choose a waiting request's shape."""
    domain = _active.get("domain")
    if domain is None:
        return original(adder, req, **kwargs)
    is_plain, replays, tiles = adder.__dict__.get(FACTS) or _facts(adder)
    prefix_len = req.prefix_len + kwargs["host_hit_length"]
    if (
        not is_plain
        or kwargs["swa_host_hit_length"]
        or (replays and adder._replay_len(req, prefix_len))
    ):
        return original(adder, req, **kwargs)
    decision = _shape(domain, adder, req, prefix_len, tiles, kwargs)
    return original(adder, req, **kwargs) if decision is FALLBACK else decision


def _shape(domain: Ints, adder: Any, req: Any, prefix_len: int, tiles: bool, kwargs: dict) -> Any:
    sp, page = _upstream(), adder.page_size
    prompt = len(req.full_untruncated_fill_ids)
    remaining = prompt - req.prefix_len
    # upstream's total_tokens = remaining + generated-token reserve + per-request page
    first = kwargs["total_tokens"] - remaining - adder.per_req_token_overhead
    # one read of the pool for both ledgers (``PrefillBudget``'s definition of each is free
    # plus evictable less an offset; the read is the costly part of either property)
    budget = adder.memory_budget
    base = budget._available_and_evictable()
    rem_total, cur_rem = base - budget.total_offset, base - budget.current_offset
    view = admit_view(
        prompt_tokens=prompt,
        remaining_tokens=remaining,
        host_prefix_tokens=kwargs["host_hit_length"],
        first_tokens=first,
        page_size=page,
        # upstream compares ints against float ledgers (``x < remaining``): the ceiling keeps
        # that comparison exact for an int-valued view
        rem_total_tokens=math.ceil(rem_total),
        cur_rem_tokens=math.ceil(cur_rem),
    )
    verdict = guard.admits(domain, view, req)
    if verdict is FALLBACK:
        return FALLBACK
    if not verdict:
        return sp.AddReqResult.NO_TOKEN
    extend = prompt - prefix_len
    rem_total = int(rem_total)
    chunking = chunk_view(extend, adder.rem_chunk_tokens, rem_total, rem_total, page, False)
    chunk = guard.chunk(domain, "new_chunk", chunking, req)
    if chunk is FALLBACK:
        return FALLBACK
    if chunk == 0:
        return sp.AddReqResult.OTHER  # no room to start it this round
    if chunk < extend and (
        getattr(adder, HOLDS_CHUNK, False)
        or adder.new_chunked_req is not None
        or (kwargs.get("has_chunked_req") and sp.get_schedule().schedule_policy == SPF)
    ):
        # a second in-progress request: the scheduler tracks one (and asserts so)
        return sp.AddReqResult.OTHER
    if chunk == extend:
        tile = -(-extend // page) * page  # upstream's ceil_paged_tokens
        if tiles and (refused := adder._check_prefill_tile_budget(tile)) is not None:
            return refused
        max_new = min(req.sampling_params.max_new_tokens, sp.CLIP_MAX_NEW_TOKENS)
        return sp._PrefillAdmission(prefix_len, extend, max_new, False, 0)
    end = _align(domain, adder, req, prefix_len, prefix_len + chunk)
    if end is FALLBACK:
        return FALLBACK
    if tiles and (refused := adder._check_prefill_tile_budget(end - prefix_len)) is not None:
        return refused
    return sp._PrefillAdmission(prefix_len, end - prefix_len, 0, True, 0)


def commit_admission(result: Any, adder: Any, req: Any, admission: Any, *args: Any) -> None:
    """AFTER ``_commit_prefill_admission``: a truncated new request's tail reservation."""
    if not admission.is_chunked:
        return  # admitted whole: no tail (the common case, so asked first)
    domain = _active.get("domain")
    if domain is None or not plain(adder):
        return
    tail = len(req.full_untruncated_fill_ids) - (admission.prefix_len + admission.extend_len)
    _reserve_tail(domain, adder, req, tail)


def resume_chunked(original: Any, adder: Any, req: Any) -> Any:
    """AROUND ``add_chunked_req``: the in-progress request's resume length, or its deferral."""
    domain = _active.get("domain")
    if domain is None or not plain(adder):
        return original(adder, req)
    remaining = len(req.full_untruncated_fill_ids) - req.prefix_len
    view = _chunk_view(adder, remaining, adder.rem_total_tokens)
    chunk = guard.chunk(domain, "resume_chunk", view, req)
    if chunk is FALLBACK:
        return _holding(adder, original(adder, req))
    if chunk == 0:
        # parked: computes nothing this round and stays the in-progress request
        req.extend_end = req.prefix_len
        return _holding(adder, req)
    if chunk < remaining:
        end = _align(domain, adder, req, req.prefix_len, req.prefix_len + chunk)
        if end is FALLBACK:
            return _holding(adder, original(adder, req))
        chunk = end - req.prefix_len
    saved = adder.chunked_req_limit
    adder.chunked_req_limit = chunk if saved is None else min(saved, chunk)
    try:
        result = original(adder, req)
    finally:
        adder.chunked_req_limit = saved
    if result is req and adder.can_run_list and adder.can_run_list[-1] is req:
        _reserve_tail(domain, adder, req, len(req.full_untruncated_fill_ids) - req.extend_end)
    return _holding(adder, result)


def _holding(adder: Any, result: Any) -> Any:
    """Note on the adder whether the in-progress request stays in progress (``result``)."""
    setattr(adder, HOLDS_CHUNK, result is not None)
    return result
