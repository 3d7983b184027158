"""The round kernel (``policykit.kernel``) decides alike on ints and on z3 terms.

The planner runs the kernel's decisions on ints (:class:`policykit.kernel.Ints`), the checker
on terms (``policykit.spec.encoding.Terms``). Here each decision is run both ways on the same
concrete inputs, for every built-in combo: the terms, with the inputs fixed, must take the
values the ints took. A broken policy answer raises on ints and is a true ``bad`` condition
on terms.
"""

from __future__ import annotations

import pytest
import z3
from hypothesis import given, settings
from hypothesis import strategies as st

from policykit import kernel
from policykit.config import EngineConfig
from policykit.errors import PolicyError
from policykit.kernel import Ints, Offer
from policykit.ledger import Ledger
from policykit.plugin_manager import make_plugin_manager
from policykit.policy import AlignmentPolicy
from policykit.registry import Combo, PolicyRegistry
from policykit.spec.encoding import Encoder, Terms, t
from policykit.spec.symbolic import Sym, num

PAGE, CHUNK = 64, 512
ALL = list(
    PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False)).all_combos(
        EngineConfig(PAGE, CHUNK)
    )
)
#: one combo per chunking and alignment policy (what a resume asks)
COMBOS = list({(c.chunking.spec, c.alignment.spec): c for c in ALL}.values())


def _ledger(baseline: object, chunk: object, total_offset: object, cur_offset: object) -> Ledger:
    return Ledger(
        page_size=PAGE,
        baseline=baseline,  # type: ignore[arg-type]
        rem_chunk_tokens=chunk,  # type: ignore[arg-type]
        rem_total_token_offset=total_offset,  # type: ignore[arg-type]
        cur_rem_token_offset=cur_offset,  # type: ignore[arg-type]
    )


def _sym(v: int) -> Sym:
    return Sym(num(v))


def _value(model: z3.ModelRef, x: object) -> int | bool:
    v = model.eval(t(x), model_completion=True)
    return z3.is_true(v) if z3.is_bool(v) else v.as_long()


def _on_terms(combo: Combo, fn):  # type: ignore[no-untyped-def]
    """Run ``fn(num, lift)`` on the z3 domain and return ``(model, result)``: the encoder's
    facts (the named answers) solved with every input a constant."""
    with Encoder() as enc:
        result = fn(Terms(enc, combo, {}), _sym)
        solver = z3.Solver()
        solver.add(*enc.facts)
        assert solver.check() == z3.sat
        return solver.model(), result


states = st.tuples(
    st.integers(1, 40).map(lambda p: p * PAGE),  # baseline
    st.integers(0, CHUNK),  # compute budget left
    st.integers(0, 3).map(lambda p: p * PAGE),  # offsets already promised
    st.integers(1, 3000),  # prompt
    st.integers(0, 2999),  # computed so far
)


@pytest.mark.parametrize("combo", COMBOS, ids=str)
@settings(max_examples=25)
@given(state=states)
def test_resume_agrees_on_ints_and_terms(combo: Combo, state: tuple) -> None:
    baseline, budget, offset, prompt, seq = state
    seq = min(seq, prompt - 1)
    ints = kernel.resume(
        Ints(combo), _ledger(baseline, budget, offset, offset), prompt, seq, None, "R"
    )

    def on_terms(n, lift):  # type: ignore[no-untyped-def]
        led = _ledger(lift(baseline), lift(budget), lift(offset), lift(offset))
        return kernel.resume(n, led, lift(prompt), lift(seq), None, "R")

    model, terms = _on_terms(combo, on_terms)
    assert _value(model, terms.chunk) == ints.chunk
    assert _value(model, terms.deferred) == ints.deferred
    assert _value(model, terms.final) == ints.final
    assert not _value(model, terms.bad_range)
    if not ints.deferred:
        for field in ("baseline", "rem_total_tokens", "cur_rem_tokens", "rem_chunk_tokens"):
            assert _value(model, getattr(terms.ledger, field)) == getattr(ints.ledger, field)
    if not ints.deferred and not ints.final:
        assert _value(model, terms.end) == ints.end
        assert not _value(model, terms.bad_truncation)


@pytest.mark.parametrize("combo", ALL[:4], ids=str)
def test_views_agree_on_ints_and_terms(combo: Combo) -> None:
    led = _ledger(20 * PAGE, CHUNK, PAGE, 0)
    ints = kernel.admit_view(900, 700, 128, led, None)

    def on_terms(n, lift):  # type: ignore[no-untyped-def]
        sym_led = _ledger(lift(20 * PAGE), lift(CHUNK), lift(PAGE), lift(0))
        return kernel.admit_view(lift(900), lift(700), lift(128), sym_led, None)

    model, terms = _on_terms(combo, on_terms)
    for field in ("prompt_tokens", "remaining_tokens", "rem_total_tokens", "cur_rem_tokens"):
        assert _value(model, getattr(terms, field)) == getattr(ints, field)


class PastTheEnd(AlignmentPolicy):
    """Moves a chunk's end one token past it: a broken alignment."""

    name = "past-the-end"

    def align_end(self, view):  # type: ignore[no-untyped-def]
        return view.end + 1


def _broken(combo: Combo) -> Combo:
    import dataclasses

    return dataclasses.replace(combo, alignment=PastTheEnd())


def test_a_broken_alignment_raises_on_ints_and_is_bad_on_terms() -> None:
    combo = _broken(ALL[0])
    with pytest.raises(PolicyError, match="moved the end of the chunk \\[0, 100\\)"):
        kernel.truncate(Ints(combo), _ledger(40 * PAGE, CHUNK, 0, 0), 0, 100, 300, "R")

    def on_terms(n, lift):  # type: ignore[no-untyped-def]
        led = _ledger(lift(40 * PAGE), lift(CHUNK), lift(0), lift(0))
        return kernel.truncate(n, led, lift(0), lift(100), lift(300), "R")

    model, (end, bad) = _on_terms(combo, on_terms)
    assert _value(model, end) == 101
    assert _value(model, bad) is True


def test_a_chunk_out_of_range_raises_on_ints() -> None:
    class TooLong:
        kind, spec, source = "chunking", "too-long", "test"

        def resume_chunk(self, view):  # type: ignore[no-untyped-def]
            return view.remaining_tokens + 1

    import dataclasses

    combo = dataclasses.replace(ALL[0], chunking=TooLong())
    with pytest.raises(PolicyError, match="a chunk length is an int in \\[0, 200\\]"):
        kernel.resume(Ints(combo), _ledger(40 * PAGE, CHUNK, 0, 0), 300, 100, None, "R")


#: one combo per admission, chunking and alignment policy (what an admission asks)
ADMITTING = list({(c.admission.spec, c.chunking.spec, c.alignment.spec): c for c in ALL}.values())

offers = st.tuples(
    st.integers(1, 40).map(lambda p: p * PAGE),  # baseline
    st.integers(0, CHUNK),  # compute budget left
    st.integers(0, 3).map(lambda p: p * PAGE),  # offsets already promised
    st.integers(2, 3000),  # prompt
    st.integers(0, 30).map(lambda p: p * PAGE),  # device prefix cached
    st.integers(0, 20).map(lambda p: p * PAGE),  # host prefix (whole pages)
    st.booleans(),  # locking the cached prefix takes it out of the evictable pool
    st.booleans(),  # the round already has an in-progress request
)


def _admitted(num, ledger, prompt, offer, has, lift=lambda x: x):  # type: ignore[no-untyped-def]
    """The admission on ``offer``, afresh (nothing cached) where its own lock refuses it."""
    first, refused = kernel.admission(num, ledger, prompt, Offer(*offer), has, None, "R")

    def retry():  # type: ignore[no-untyped-def]
        nothing = Offer(*map(lift, (0, 0, 0, 0)))
        return kernel.admission(num, ledger, prompt, nothing, has, None, "R")[0]

    return kernel.afresh(num, refused, first, retry)


@pytest.mark.parametrize("combo", ADMITTING, ids=str)
@settings(max_examples=12)
@given(state=offers)
def test_admission_agrees_on_ints_and_terms(combo: Combo, state: tuple) -> None:
    """The admission attempt, its lock and its re-selection: the terms, with every input
    fixed, take the values the ints took (the attempt that stands, its chunk and ledger)."""
    baseline, budget, offset, prompt, cached, host, locks, has = state
    cached = min(cached, (prompt - 1) // PAGE * PAGE)
    host = max(0, min(host, (prompt - 1 - cached) // PAGE * PAGE))
    offer = (cached, host, cached if locks else 0, host)
    ints = _admitted(Ints(combo), _ledger(baseline, budget, offset, offset), prompt, offer, has)

    def on_terms(n, lift):  # type: ignore[no-untyped-def]
        led = _ledger(lift(baseline), lift(budget), lift(offset), lift(offset))
        return _admitted(n, led, lift(prompt), tuple(map(lift, offer)), has, lift)

    model, terms = _on_terms(combo, on_terms)
    assert _value(model, terms.ok) == ints.ok
    if not ints.ok:
        return
    assert _value(model, terms.other) == ints.other
    assert _value(model, terms.offer.cached) == ints.offer.cached
    assert _value(model, terms.offer.lock) == ints.offer.lock
    if ints.other:
        return
    assert _value(model, terms.chunk) == ints.chunk
    assert _value(model, terms.whole) == ints.whole
    assert _value(model, terms.start) == ints.start
    if not ints.whole:
        assert _value(model, terms.end) == ints.end
    for field in ("baseline", "rem_total_tokens", "cur_rem_tokens", "rem_chunk_tokens"):
        assert _value(model, getattr(terms.ledger, field)) == getattr(ints.ledger, field)


def test_a_request_refused_by_its_own_lock_is_asked_about_afresh() -> None:
    """A policy that gives no credit for a cached prefix refuses the request once the prefix
    is locked; the admission is then made afresh, nothing cached (ints and terms alike)."""

    class NoCredit:
        kind, spec, source = "admission", "no-credit", "test"

        def admit(self, view):  # type: ignore[no-untyped-def]
            return view.prompt_tokens <= view.rem_total_tokens

        def tail_reserve(self, view):  # type: ignore[no-untyped-def]
            return 0

    import dataclasses

    combo = dataclasses.replace(ALL[0], admission=NoCredit())
    # 640 tokens free, 256 of them the request's own cached prefix: locked, 384 are left
    ints_led = _ledger(10 * PAGE, CHUNK, 0, 0)
    first, refused = kernel.admission(
        Ints(combo), ints_led, 600, Offer(256, 0, 256, 0), False, None, "R"
    )
    assert refused and not first.ok
    got = _admitted(Ints(combo), ints_led, 600, (256, 0, 256, 0), False)
    assert got.ok and not got.other and got.offer.cached == 0 and got.start == 0

    def on_terms(n, lift):  # type: ignore[no-untyped-def]
        led = _ledger(lift(10 * PAGE), lift(CHUNK), lift(0), lift(0))
        return _admitted(n, led, lift(600), tuple(map(lift, (256, 0, 256, 0))), False, lift)

    model, terms = _on_terms(combo, on_terms)
    assert _value(model, terms.ok) and _value(model, terms.offer.cached) == 0


@pytest.mark.parametrize("combo", ADMITTING[:12], ids=str)
@settings(max_examples=10)
@given(
    capacity=st.integers(0, 60).map(lambda p: p * PAGE),
    prompt=st.integers(1, 4000),
    pinned=st.integers(0, 10).map(lambda p: p * PAGE),
)
def test_idle_answers_agree_on_ints_and_terms(
    combo: Combo, capacity: int, prompt: int, pinned: int
) -> None:
    pinned = min(pinned, (prompt - 1) // PAGE * PAGE)
    shape = {"page": PAGE, "chunk_size": CHUNK, "window": None, "request_id": "R"}
    ints = kernel.idle_answers(Ints(combo), prompt, pinned, 0, capacity, None, **shape)

    def on_terms(n, lift):  # type: ignore[no-untyped-def]
        return kernel.idle_answers(
            n, lift(prompt), lift(pinned), lift(0), lift(capacity), None, **shape
        )

    model, terms = _on_terms(combo, on_terms)
    assert _value(model, terms.ok) == ints.ok
    if ints.ok:
        assert _value(model, terms.chunk) == ints.chunk
        assert not _value(model, terms.bad)
