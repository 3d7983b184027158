"""The symbolic evaluator: same answers as Python on concrete points, clear refusals."""

from __future__ import annotations

import pytest
import z3
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policykit.policy import AlignView, ChunkView
from policykit.spec.lifted import evaluate
from policykit.spec.symbolic import Sym, SymbolicEvaluationError, num


def _at(term: Sym, **values: int) -> int:
    subs = [(z3.Int(k), num(v)) for k, v in values.items()]
    return z3.simplify(z3.substitute(term.t, *subs)).as_long()


@pytest.mark.parametrize(
    "spec", ["page", "checkpoint:256", "truncation:192"], ids=lambda s: s.split(":")[0]
)
@settings(max_examples=30, deadline=None)
@example(start=2816 - 192, length=192)
@given(start=st.integers(0, 5000), length=st.integers(1, 5000))
def test_alignment_agrees_with_python(registry, spec: str, start: int, length: int) -> None:
    policy = registry.make("alignment", spec)
    s, e = Sym(z3.Int("s")), Sym(z3.Int("e"))
    merged = evaluate(policy, "align_end", AlignView(s, e, 64))  # type: ignore[arg-type]
    expected = policy.align_end(AlignView(start, start + length, 64))
    assert _at(merged, s=start, e=start + length) == expected


@settings(max_examples=40, deadline=None)
@given(
    remaining=st.integers(1, 9000),
    chunk=st.integers(-200, 4096),
    total=st.integers(-500, 9000),
    swa=st.integers(-100, 9000),
    hybrid=st.booleans(),
    name=st.sampled_from(["sglang", "defer", "swa-reserve"]),
)
def test_chunking_agrees_with_python(registry, remaining, chunk, total, swa, hybrid, name) -> None:
    policy = registry.make("chunking", name)
    names = ("r", "c", "t", "w")
    syms = [Sym(z3.Int(n)) for n in names]
    view = ChunkView(*syms, page_size=64, hybrid_swa=hybrid)  # type: ignore[arg-type]
    concrete = ChunkView(remaining, chunk, total, swa, 64, hybrid)
    values = dict(zip(names, (remaining, chunk, total, swa), strict=True))
    for method in ("new_chunk", "resume_chunk"):
        merged = evaluate(policy, method, view)
        assert _at(merged, **values) == getattr(policy, method)(concrete)


class _Indexing:
    kind, spec = "alignment", "indexing"

    def align_end(self, v):
        return [v.start, v.end][v.end]


class _BoundedIndexing:
    """An index the path bounds (``% 2`` is 0 or 1): each value is a path of its own."""

    kind, spec = "alignment", "bounded-indexing"

    def align_end(self, v):
        return [v.end, v.start + 1][v.end % 2] + int(v.start % 3)


class _Random:
    kind, spec = "alignment", "random"
    calls = 0

    def align_end(self, v):
        self.calls += 1
        if self.calls % 2 and v.end > v.start:
            return v.end
        return v.start + 1


def test_indexing_with_a_symbol_is_refused_with_the_line() -> None:
    view = AlignView(Sym(z3.Int("s")), Sym(z3.Int("e")), 64)  # type: ignore[arg-type]
    with pytest.raises(SymbolicEvaluationError, match=r"as an index.*test_symbolic.py:\d+"):
        evaluate(_Indexing(), "align_end", view)


@settings(max_examples=30, deadline=None)
@given(start=st.integers(-300, 300), end=st.integers(-300, 300))
def test_a_bounded_index_and_int_of_a_bounded_value_agree_with_python(start, end) -> None:
    view = AlignView(Sym(z3.Int("s")), Sym(z3.Int("e")), 64)  # type: ignore[arg-type]
    merged = evaluate(_BoundedIndexing(), "align_end", view)
    assert _at(merged, s=start, e=end) == _BoundedIndexing().align_end(AlignView(start, end, 64))


def test_a_policy_that_counts_its_calls_is_refused_at_the_store() -> None:
    view = AlignView(Sym(z3.Int("s")), Sym(z3.Int("e")), 64)  # type: ignore[arg-type]
    with pytest.raises(SymbolicEvaluationError, match=r"writes state.*test_symbolic.py:\d+"):
        evaluate(_Random(), "align_end", view)
