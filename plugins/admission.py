"""Built-in admission policies.

The difference between them is one question: when a request is truncated, who pays for its
*tail* (the part computed in later rounds)?
"""

from __future__ import annotations

from policykit.hookspecs import hookimpl
from policykit.pages import ceil_paged
from policykit.policy import AdmissionPolicy, AdmitView, TailView


class SGLangAdmission(AdmissionPolicy):
    """SGLang 0.5.23: the tail of a truncated request is not recorded in the ledger.

    Reproduces ``check_prefill``/``reserve`` of ``PrefillBudget`` (plain KV pool) and of
    ``SWAPrefillBudget`` (hybrid SWA), checked against SGLang 0.5.23's real ``PrefillAdder``
    by ``policykit conformance sglang``. Under hybrid SWA a request also needs its
    window-capped sliding-window estimate (``swa_need``) to fit ``rem_swa_tokens``; on a
    shortage it waits, unless it could never fit the sliding-window pool, in which case it
    enters with a capped chunk (``chunking=sglang``). Safe only while truncation also exhausts
    the compute budget, so that nothing else can enter the round. Checkpoint or truncation
    alignment breaks that (docs/incidents.md#truncated-tail).
    """

    name = "sglang"

    def admit(self, v: AdmitView) -> bool:
        if v.remaining_tokens + v.first_tokens + v.page_size >= v.rem_total_tokens:
            return False
        if not v.hybrid_swa or v.swa_need < v.rem_swa_tokens:
            return True
        return v.swa_need >= v.swa_pool_tokens and v.swa_chunk_cap > 0

    def tail_reserve(self, v: TailView) -> int:
        return 0


class ReserveTailAdmission(SGLangAdmission):
    """The truncated-tail fix: a truncated request's paged tail and first token are promised
    (docs/incidents.md#truncated-tail).

    Recorded in ``rem_total_token_offset`` only (the tail is allocated in later rounds), on
    first truncation and on every resumed chunk that is truncated again, so the memory ledger no
    longer depends on the compute budget running out.
    """

    name = "reserve-tail"

    def tail_reserve(self, v: TailView) -> int:
        return ceil_paged(v.tail_tokens, v.page_size) + v.first_tokens


class NoEvictAdmission(ReserveTailAdmission):
    """TensorRT-LLM ``GUARANTEED_NO_EVICT`` style: reserve the whole prompt up front.

    A request enters only if KV for its *entire* prompt (no credit for a device prefix hit, in
    whole pages, plus a page of headroom and its first token) fits what may still be promised;
    the tail of a truncated request stays reserved until it runs. Conservative by design: it
    trades admissions for never having to evict or recompute.
    """

    name = "no-evict"

    def admit(self, v: AdmitView) -> bool:
        need = ceil_paged(v.prompt_tokens, v.page_size) + v.first_tokens + v.page_size
        return need <= v.rem_total_tokens and need <= v.cur_rem_tokens


@hookimpl
def policykit_register_policies(register):
    register(SGLangAdmission)
    register(ReserveTailAdmission)
    register(NoEvictAdmission)
