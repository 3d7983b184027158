"""The induction's encoding agrees with real rounds (``policykit.spec.induction``).

The unbounded proofs quantify over *arbitrary* states, so nothing in the bounded conformance
test exercises their encoding: a wrong step there would prove the wrong thing. Here real rounds
of the real scheduler are replayed through it. At every round start where the invariant holds
(what the in-progress request owes fits in free + evictable), the encoded resume is fixed to
that state and must plan the real resume and establish ``J``; then for every real admission,
the encoded admission step, fixed to the real ledger just before it and to the real request,
must plan the real entry and take ``J`` to ``J`` (for combos the induction proves).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import z3
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policykit.config import EngineConfig
from policykit.ledger import Ledger
from policykit.liveness import owed_tokens
from policykit.pages import extend_pages
from policykit.plan import EntryKind
from policykit.scenario import build_node, parse_scenario
from policykit.scheduler import Scheduler
from policykit.spec.encoding import Encoder
from policykit.spec.induction import Mid, Obligations
from policykit.spec.model import KIND_NAMES, RoundModel, owed
from policykit.spec.solver import QUERY_RLIMIT
from policykit.spec.symbolic import Sym

#: combos whose no-oom / admitted-completes induction goes through (so J must be preserved)
PROVED = [
    "admission=reserve-tail,chunking=sglang,alignment=page",
    "admission=reserve-tail,chunking=defer,alignment=checkpoint:256",
    "admission=no-evict,chunking=sglang,alignment=none",
    "admission=sglang,chunking=sglang,alignment=page",
]
PAGE, CHUNK = 64, 512
CONFIG = EngineConfig(PAGE, CHUNK)


@dataclasses.dataclass
class Snapshot:
    """The planner's state just before one of its decisions."""

    ledger: Ledger
    has_chunked: bool
    deferred: bool
    extend: int  #: slots ``alloc_extend`` takes for what is planned so far
    owed: int  #: what the in-progress request still owes after what is planned


class Recorder:
    """Follows one round of the real planner: the state before each admission."""

    def __init__(self) -> None:
        self.before: dict[str, Snapshot] = {}
        self.state: Snapshot | None = None
        self.prompts: dict[str, int] = {}

    def open(self, ledger: Ledger) -> None:
        self.before = {}
        self.state = Snapshot(dataclasses.replace(ledger), False, False, 0, 0)

    def admit(self, request_id: str, entry: Any, ledger: Ledger) -> None:
        s = self.state
        assert s is not None
        stays = entry.kind in (EntryKind.TRUNCATED, EntryKind.RESUMED)
        if entry.kind.is_new:
            self.before[request_id] = dataclasses.replace(s, ledger=s.ledger)
        extend = extend_pages(entry.end, entry.start, PAGE) * PAGE if entry.tokens else 0
        owed = owed_tokens(self.prompts[request_id], entry.end, PAGE) if stays else 0
        self.state = Snapshot(
            dataclasses.replace(ledger),
            s.has_chunked or stays,
            s.deferred,
            s.extend + extend,
            s.owed + owed,
        )

    def reject(self, request_id: str, verdict: str, ledger: Ledger) -> None: ...


def _solve(enc: Encoder, fixed: list[z3.BoolRef]) -> z3.ModelRef:
    solver = z3.Solver()
    solver.add(*enc.facts, *fixed)
    assert solver.check() == z3.sat, "the encoding has no step for a real state"
    return solver.model()


def _val(m: z3.ModelRef, x: Any) -> Any:
    v = m.eval(x.t if isinstance(x, Sym) else x, model_completion=True)
    return z3.is_true(v) if z3.is_bool(v) else v.as_long()


def _j(ob: Obligations, m: Mid) -> z3.BoolRef:
    return ob._j_full(m) if ob._full_with == "full" else ob._j_spent(m)


def _check_resume(ob: Obligations, combo, entry, baseline: int, prompt: int, seq: int) -> None:
    with Encoder() as enc:
        model = RoundModel(combo, CONFIG, enc, {})
        mid, i = ob._after_resume(enc, model)
        j = _j(ob, mid)  # before solving: J's own division facts join the formula
        m = _solve(
            enc,
            [
                i["has"],
                i["B"].t == baseline,
                i["p"].t == prompt,
                i["seq"].t == seq,
                i["swa"].t == 0,
            ],
        )
        e = i["entry"]
        got = (KIND_NAMES[_val(m, e.kind)], _val(m, e.start), _val(m, e.end))
        assert got == (entry.kind.value, entry.start, entry.end)
        assert _val(m, j), "the invariant holds at the round start but J does not"


def _check_admit(ob: Obligations, combo, before: Snapshot, req: dict, entry, cached: bool) -> None:
    """The encoded step, fixed to the real state, plans the real entry and keeps ``J``.
    ``cached``: the request's unpinned prefix was cached when the round opened. Whether the
    planner still found it (a load-back earlier in the round may have evicted it) shows in the
    entry only when it was used, so a request that computed from 0 is checked both ways and
    one of them must plan the real entry."""
    device = req.get("device_prefix_tokens", 0)
    pinned = req.get("device_prefix_pinned", False)
    found = [bool(device) and not pinned and entry.cached > 0]
    if cached and not entry.cached:
        found.append(True)
    errors = []
    for present in found:
        # an unpinned prefix not used: evicted (the host holds it with a host prefix of a
        # page or more), or refused by its own lock and asked afresh (nothing offered)
        for afresh in (False, True) if device and not pinned and not present else (False,):
            try:
                _check_admit_with(ob, combo, before, req, entry, present, afresh)
                return
            except AssertionError as err:
                errors.append(err)
    raise errors[0]


def _check_admit_with(
    ob: Obligations, combo, before: Snapshot, req: dict, entry, present: bool, afresh: bool
) -> None:
    led = before.ledger
    device = req.get("device_prefix_tokens", 0)
    host = req.get("host_prefix_tokens", 0)
    locks = bool(device) and not req.get("device_prefix_pinned", False) and present
    if device and not locks and not req.get("device_prefix_pinned", False):
        lost = device + host if host >= CONFIG.page_size and not afresh else 0
        device, host = 0, lost
    with Encoder() as enc:
        model = RoundModel(combo, CONFIG, enc, {})
        mid = ob._arbitrary_mid(enc, model)
        ml = mid.state.ledger
        fixed = [
            ml.baseline.t == led.baseline,
            ml.rem_chunk_tokens.t == led.rem_chunk_tokens,
            ml.rem_total_token_offset.t == led.rem_total_token_offset,
            ml.cur_rem_token_offset.t == led.cur_rem_token_offset,
            ml.rem_swa_token_offset.t == led.rem_swa_token_offset,
            mid.state.has_chunked == before.has_chunked,
            mid.state.deferred == before.deferred,
            mid.extend.t == before.extend,
            mid.owed.t == before.owed,
        ]
        nxt, e = ob._admit_step(enc, model, mid)
        j_before, j_after = _j(ob, mid), _j(ob, nxt)
        q = ob._last_request
        fixed += [
            q.prompt.t == req["prompt_tokens"],
            q.device.t == device,
            ob._last_locks == locks,
            q.host.t == host,
        ]
        m = _solve(enc, fixed)
        got = (KIND_NAMES[_val(m, e.kind)], _val(m, e.start), _val(m, e.end))
        assert got == (entry.kind.value, entry.start, entry.end)
        if _val(m, j_before):
            assert _val(m, j_after), "a real admission takes J to a state where it fails"


#: per z3 context (each test gets a fresh one) and combo: the obligations, proved once
_PROVED: dict[tuple[int, str], Obligations] = {}


def _obligations(combo) -> Obligations:
    key = (id(z3.main_ctx()), str(combo))
    if key not in _PROVED:
        _PROVED.clear()
        ob = Obligations(combo, CONFIG, {}, QUERY_RLIMIT)
        assert ob.prove("no-oom") == "proved"
        full = ob._two_level(ob._j_full, _inv, _post) == "valid"
        ob._full_with = "full" if full else "spent"  # which J the proof went through with
        _PROVED[key] = ob
    return _PROVED[key]


def replay_rounds(registry, combo_text: str, scenario: dict, rounds: int = 6) -> int:
    """Check every round start and admission of a real run; returns the steps checked."""
    combo = registry.resolve(combo_text)
    ob = _obligations(combo)
    sc = parse_scenario(scenario)
    sched = Scheduler(build_node(sc), combo)
    rec = Recorder()
    rec.prompts = {r.id: r.prompt_tokens for r in sc.requests}
    specs = {r["id"]: r for r in scenario["requests"]}
    sched.planner.observer = rec
    opened = sched.planner.open_ledger

    def open_ledger() -> Ledger:
        ledger = opened()
        rec.open(ledger)
        return ledger

    sched.planner.open_ledger = open_ledger  # type: ignore[method-assign]
    checked = 0
    sched.start_serving()
    for _ in range(rounds):
        node = sched.node
        start = (node.baseline, node.chunked)
        # whose unpinned prefix is cached as the round opens (read without touching the LRU)
        cached = {q.id for q in node.waiting if q.tokens[:PAGE] in node.cache.root.children}
        chunked = None if start[1] is None else (start[1].prompt_tokens, start[1].seq_len)
        record = sched._step_or_oom()
        if record is None:
            break
        plan = record.plan
        if chunked is not None:
            owes = owed_tokens(chunked[0], chunked[1], PAGE)
            if owes <= start[0]:
                _check_resume(ob, combo, plan.entries[0], start[0], *chunked)
                checked += 1
        for entry in plan.entries:
            if entry.kind.is_new:
                _check_admit(
                    ob,
                    combo,
                    rec.before[entry.request_id],
                    specs[entry.request_id],
                    entry,
                    entry.request_id in cached,
                )
                checked += 1
        if sched.idle(record):
            break
    return checked


def _inv(i: dict) -> z3.BoolRef:
    """The invariant between rounds (``Obligations.prove``): what is owed fits."""
    return z3.Implies(i["has"], owed(i["p"], i["seq"], PAGE).t <= i["B"].t)


def _post(m: Mid) -> z3.BoolRef:
    return m.extend.t + m.owed.t <= m.state.ledger.baseline.t


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 4))
    requests = []
    for i in range(n):
        prompt = draw(st.integers(1, 40)) * PAGE
        device = draw(st.integers(0, prompt // PAGE - 1)) * PAGE
        host = draw(st.integers(0, (prompt - device) // PAGE - 1)) * PAGE
        item = {"id": "ABCD"[i], "prompt_tokens": prompt, "arrival_round": draw(st.integers(1, 3))}
        if device:
            item["device_prefix_tokens"] = device
            item["device_prefix_pinned"] = draw(st.booleans())
        if host:
            item["host_prefix_tokens"] = host
        requests.append(item)
    requests.sort(key=lambda r: r["arrival_round"])
    pinned = sum(r["device_prefix_tokens"] for r in requests if r.get("device_prefix_pinned"))
    unpinned = sum(r.get("device_prefix_tokens", 0) for r in requests) - pinned
    free = draw(st.integers(max(0, 41 - (pinned + unpinned) // PAGE), 80)) * PAGE
    evictable = unpinned + draw(st.integers(0, 10)) * PAGE
    return {
        "page_size": PAGE,
        "chunked_prefill_size": CHUNK,
        "pool": {"free_tokens": free, "evictable_tokens": evictable},
        "kv_release_rounds": draw(st.none() | st.integers(0, 2)),
        "requests": requests,
    }


SEED = {
    "page_size": PAGE,
    "chunked_prefill_size": CHUNK,
    "pool": {"free_tokens": 2048, "evictable_tokens": 256},
    "kv_release_rounds": 1,
    "requests": [
        {"id": "A", "prompt_tokens": 1280},
        {"id": "B", "prompt_tokens": 640, "host_prefix_tokens": 128},
        {"id": "C", "prompt_tokens": 896, "arrival_round": 2},
    ],
}


def test_the_seed_run_exercises_resumes_and_admissions(registry) -> None:
    assert replay_rounds(registry, PROVED[0], SEED) >= 4


@pytest.mark.parametrize(
    "combo_text",
    # each combo's examples take some seconds: the fast tier keeps the one without alignment
    [c if "alignment=none" in c else pytest.param(c, marks=pytest.mark.slow) for c in PROVED],
)
@settings(max_examples=30)  # each step is a solver call, a few per example
@example(scenario=SEED)
@given(scenario=scenarios())
def test_real_rounds_satisfy_the_encoded_step(registry, combo_text: str, scenario: dict) -> None:
    replay_rounds(registry, combo_text, scenario)
