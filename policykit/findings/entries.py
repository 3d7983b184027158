"""The four findings, each as :class:`~policykit.findings.catalog.Finding` data.

Sources: the upstream threads were read in their trackers' text (titles and states as shown
there on the date of the checks); vLLM #56028 is named by policykit's issue 32 and could not be
read here, so nothing is claimed about it beyond that. Every :class:`Check` is a run of the
reproducer this package holds, on the release it names.
"""

from __future__ import annotations

from policykit.findings.catalog import Avoid, Check, Finding, Thread

VLLM, SGLANG = "vllm-project/vllm", "sgl-project/sglang"
_DAY = "2026-12-06"
_HERE = "a venv with the release installed --no-deps (2-core CPU machine)"
_VLLM_CHECKS = (
    Check("0.33.0", True, _DAY, _HERE),
    Check("0.34.0", True, _DAY, _HERE),
)
_DEFAULT = Avoid(
    combo="vllm/vllm/none/default/fcfs/vllm",
    settings="vLLM's defaults: scheduler_reserve_full_isl=True, no long_prefill_token_threshold",
    verdicts=(
        ("admitted-completes", "proved (unbounded)"),
        ("no-starvation", "proved (unbounded)"),
    ),
    command="policykit check --combo vllm/vllm/none/default/fcfs/vllm",
)
_PD_STALL = Thread(
    VLLM, 40968, "PR", "[Bugfix] Resolve PD scheduler stall via lateral preemption", "closed",
    "A prefill rank stalled by blocks held at the head of the waiting queue by two requests "
    "waiting on remote KV. Here the blocks are held by a finished request's pending send, and "
    "the request left waiting is one vLLM admitted and then preempted itself.",
)  # fmt: skip

RESERVATION_OFF = Finding(
    id="vllm-reservation-off",
    engine="vllm",
    title="vLLM admits a request it can never complete and preempts itself for good "
    "(scheduler_reserve_full_isl=False)",
    failure="admitted-completes",
    summary="With full-sequence reservation off, a waiting request enters when its first "
    "chunk's blocks are free. Beside a finished request whose KV is held for its transfer, its "
    "next chunk does not fit; vLLM preempts running[-1], the request itself. Its computed blocks "
    "go back to the free queue as cached blocks, and from then on its prefix-cache hit takes "
    "exactly those blocks out of the free queue, so the new blocks its next chunk needs are "
    "never there: no step schedules anything while the held KV stays held.",
    settings="scheduler_reserve_full_isl=False, chunked prefill and prefix caching on (the "
    "defaults), a KV connector that holds finished requests' blocks (a disaggregated prefill "
    "instance) whose transfers do not complete",
    reproducer=("vllm_stall", "reservation-off"),
    shows="B: PREEMPTED in waiting, num_computed_tokens 0, num_preemptions 1, and every "
    "later step schedules nothing",
    upstream=(
        Thread(VLLM, 56028, "PR", "", "open (as issue 32 gives it)",
               "Named by policykit's issue 32 as an open PR that discusses the mechanism; its "
               "text could not be read here, so no comparison is claimed."),
        Thread(VLLM, 25538, "issue",
               "[Bug]: performance regression caused by frequently preempting and resuming a "
               "request", "open",
               "The same root (slots allocated for the step's tokens only), reported as a cost: "
               "a request resumed and preempted again and again. Here, with prefix caching on, "
               "there is no loop: after one self-preemption the request never runs again."),
        Thread(VLLM, 21809, "PR",
               "[Bugfix] Scheduler: only schedule prefill chunks when entire context fits",
               "closed",
               "The endless preempt-and-restart cycle with prefix caching disabled, proposing to "
               "admit only when the entire context fits. This finding is with prefix caching "
               "on, where the cycle ends in a permanent stop, and with the blocks held by KV "
               "transfers rather than by running requests that eventually finish."),
        _PD_STALL,
    ),
    avoid=_DEFAULT,
    no_avoid="",
    checks=_VLLM_CHECKS,
)  # fmt: skip

THRESHOLD = Finding(
    id="vllm-threshold",
    engine="vllm",
    title="vLLM with long_prefill_token_threshold admits two requests that together outgrow "
    "the pool, and one is stranded (reservation on)",
    failure="admitted-completes",
    summary="With full-sequence reservation on, each waiting request's whole prompt is checked "
    "against the free blocks, but not against the blocks requests already running still need. "
    "The long-prefill threshold cuts the first request's chunk short, so the budget left admits "
    "a second one in the same step; each passed the check alone, together they need more than "
    "the pool. In the next step the first finishes (its KV held for its transfer), the second "
    "cannot get its next block, preempts itself, and its whole prompt never fits again.",
    settings="scheduler_reserve_full_isl=True (the default), long_prefill_token_threshold=256, "
    "a KV connector that holds finished requests' blocks whose transfers do not complete",
    reproducer=("vllm_stall", "threshold"),
    shows="B: PREEMPTED in waiting, num_computed_tokens 0, num_preemptions 1, and every "
    "later step schedules nothing",
    upstream=(
        Thread(VLLM, 37307, "PR", "[Core] add option to schedule requests based on full ISL",
               "merged",
               "Admission on a new request's full input length, against a cycle of admit, fill, "
               "preempt. This finding is that check passing for two requests in one step while "
               "it counts neither one's remaining blocks against the other."),
        Thread(VLLM, 37337, "PR", "[Scheduler][WIP] Try to reduce preemption", "open",
               "Decides on the full prompt length plus a free-block margin; like the full-ISL "
               "check, it does not count what requests already running still need."),
        _PD_STALL,
    ),
    avoid=_DEFAULT,
    no_avoid="",
    checks=_VLLM_CHECKS,
)  # fmt: skip

_SGLANG_CHECKS = (Check("0.5.23", True, _DAY, _HERE),)
_SWA_TRIED = (
    "sglang/sglang/none, reserve-tail/swa-reserve/page, no-evict/swa-reserve/page and "
    "sglang/sglang/none/default/fcfs-skip, checked with --sliding-window 512 --min-swa-pool 577 "
    "--rounds 3 --requests 1: admitted-completes violated for each"
)

HOST_HIT = Finding(
    id="sglang-swa-host-hit",
    engine="sglang",
    title="SGLang with hybrid SWA starves a request whose host hit can never fit, and the "
    "requests behind it, with the whole sliding-window pool free",
    failure="never admitted, never rejected (fcfs: the queue behind it starves)",
    summary="With hybrid SWA and HiCache, a request's sliding-window reservation "
    "(estimate_swa_kv_tokens) adds its host hit's window, in whole pages, to what its own "
    "extend and first new token need plus a page. For a 576-token prompt with a 512-token host "
    "hit that is 641 tokens, one more than a 640-token pool SGLang starts with "
    "(validate_swa_pool_size accepts anything above window + page). The never-fits escape hatch "
    "caps the chunk at the pool less the same headroom, which leaves nothing: add_one_req "
    "answers NO_TOKEN every round on an idle node, and the fcfs queue never looks at the "
    "request behind it. The same prompt with no host copy is admitted and completes.",
    settings="hybrid SWA (window 512, page 64), --enable-hierarchical-cache, a sliding-window "
    "pool of 640 tokens, --schedule-policy fcfs",
    reproducer=("sglang_swa", "host-hit"),
    shows="add_one_req -> NO_TOKEN every round, swa available 640 of 640, A and C waiting",
    upstream=(
        Thread(SGLANG, 31771, "PR", "Fix hybrid-SWA HiCache load-back", "open",
               "Changes how host-resident and device-resident parts of an SWA prefix hit are "
               "accounted and recomputes SWA admission after locking and load-back. This "
               "finding is a pure host hit on an idle node; whether the PR admits it was not "
               "run here."),
        Thread(SGLANG, 27391, "PR",
               "[UnifiedTree]: Fix SWA admission budget under-counts HiCache load-back "
               "consumption", "merged",
               "Added the host hit's SWA tokens to the admission budget against an OOM. The "
               "finding is the other side of that charge: on a pool SGLang accepts, it alone "
               "makes a one-window host hit never fit."),
        Thread(SGLANG, 31205, "issue",
               "[Bug] PD prefill silently starves forever when a request's SWA budget exceeds "
               "the SWA pool (DeepSeek-V4 hybrid pool)", "closed",
               "The same symptom (the head never admitted, everything behind it starved) for "
               "prompts too long for the pool. Here the prompt computed from scratch fits and "
               "completes; only the host hit makes it never fit."),
    ),
    avoid=None,
    no_avoid="No combo avoids it inside SGLang: under hybrid SWA the plugin leaves admission "
    "to SGLang's own adder, and fcfs-skip orders like fcfs there. On policykit's own node, "
    "sglang/sglang/none/default/fcfs-skip rejects A as never fitting and serves the request "
    "behind it (no-starvation proved unbounded with --min-swa-pool 577); " + _SWA_TRIED + ".",
    checks=_SGLANG_CHECKS,
)  # fmt: skip

WINDOW_LOCK = Finding(
    id="sglang-swa-window-lock",
    engine="sglang",
    title="SGLang with hybrid SWA leaves one request stuck behind the sliding-window KV its own "
    "lock protects",
    failure="admitted-completes",
    summary="With hybrid SWA and the radix cache, a chunked request is checkpointed into the "
    "tree before each round and locked there. After a 512-token first chunk and a 64-token "
    "second one (window 512), all 576 of its sliding-window tokens stay protected, though the "
    "first 64 are out of its window: 64 tokens, one page, are left of a 640-token pool, and "
    "add_chunked_req leaves it unscheduled every round; nothing else runs, so nothing frees. "
    "With 64-token chunks the same request completes, which fits node-granular lock accounting "
    "(the lock keeps every tree node that reaches into the window whole).",
    settings="hybrid SWA (window 512, page 64), radix cache on, a sliding-window pool of 640 "
    "tokens, chunked_prefill_size 4096 (also 128 and 256)",
    reproducer=("sglang_swa", "window-lock"),
    shows="A in chunked_req with 576 of 640 tokens, swa protected 576, available 64, and "
    "nothing scheduled round after round",
    upstream=(
        Thread(SGLANG, 36458, "PR", "[Fix][DeepSeek V4] swa chunked prefill deadlock", "open",
               "The same stall (a chunked request starved by the SWA slots it holds itself) "
               "with the chunk cache (--disable-radix-cache) and the overlap scheduler, which "
               "keeps the first two chunks from being evicted. Here the radix cache is on and "
               "no overlap is involved: the slots are held by the request's lock in the tree."),
        Thread(SGLANG, 32379, "PR", "Fix SWA admission livelock on cached-prefix resumes",
               "merged",
               "A wedge at admission: a cached-prefix resume charged a second window at a "
               "two-window pool. Here the request is already running; its chunk is refused by "
               "add_chunked_req, and the protected KV is really held."),
        Thread(SGLANG, 27210, "PR", "Cap SWA compute locks to one window", "open",
               "Describes lock accounting as node-granular, so a lock on a long node pins all "
               "of it, and caps the lock at one window. That is our reading of this finding's "
               "mechanism (the 64-token-chunk contrast agrees); the PR was not run here."),
    ),
    avoid=None,
    no_avoid="No built-in combo avoids it under proof: " + _SWA_TRIED + ".",
    checks=_SGLANG_CHECKS,
)  # fmt: skip

FINDINGS: tuple[Finding, ...] = (RESERVATION_OFF, THRESHOLD, HOST_HIT, WINDOW_LOCK)


def find(finding_id: str) -> Finding | None:
    """The finding named ``finding_id``, or None."""
    return next((f for f in FINDINGS if f.id == finding_id), None)
