"""The watermark line and CUDA-OOM detection through exception chains (real torch errors)."""

from __future__ import annotations

import pytest
import torch

from policykit.errors import PrefillOutOfMemory
from policykit.memory.oom_chain import find_cuda_oom, report_cuda_oom, watermark_on_cuda_oom
from policykit.memory.watermark import Watermark, read_watermark

from .fakes import GIB, FakeAllocator

STATS = {
    "allocated_bytes.all.current": int(52.31 * GIB),
    "reserved_bytes.all.current": int(55.80 * GIB),
    "allocated_bytes.all.peak": int(58.02 * GIB),
}


def oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB.")


def test_watermark_line_matches_the_incident_format():
    line = read_watermark(FakeAllocator(stats=STATS)).format()
    assert line == "torch mem (GiB) alloc: 52.31, reserved: 55.80, frag_gap: 3.49, max_alloc: 58.02"


def test_watermark_before_cuda_init_reads_zero():
    w = Watermark.from_stats({})
    assert (w.alloc, w.reserved, w.frag_gap, w.max_alloc) == (0, 0, 0, 0)
    assert read_watermark(FakeAllocator()).format().startswith("torch mem (GiB) alloc: 0.00")


def test_one_memory_stats_call_per_watermark():
    class Counting(FakeAllocator):
        n = 0

        def memory_stats(self):
            self.n += 1
            return super().memory_stats()

    fake = Counting(stats=STATS)
    read_watermark(fake)
    assert fake.n == 1


def raise_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as caught:
        return caught


def raise_during(inner: BaseException, outer: BaseException, suppress: bool) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            if suppress:
                raise outer from None
            raise outer  # noqa: B904 - the implicit __context__ is the point
    except BaseException as caught:
        return caught


def test_direct_and_plain_runtime_error():
    assert find_cuda_oom(oom()) is not None
    assert find_cuda_oom(RuntimeError("CUDA out of memory. Tried to allocate 2.00 MiB")) is not None
    assert find_cuda_oom(RuntimeError("shape mismatch")) is None


def test_through_cause_context_and_suppressed_context():
    inner = oom()
    assert find_cuda_oom(raise_from(inner, ValueError("wrapped"))) is inner
    assert find_cuda_oom(raise_during(oom(), KeyError("cleanup"), suppress=False)) is not None
    suppressed = raise_during(oom(), KeyError("cleanup"), suppress=True)
    assert suppressed.__suppress_context__
    assert find_cuda_oom(suppressed) is not None


def test_through_nested_exception_groups():
    group = ExceptionGroup("tasks", [ValueError("a"), ExceptionGroup("inner", [oom()])])
    assert isinstance(
        find_cuda_oom(raise_from(group, RuntimeError("loop died"))), torch.OutOfMemoryError
    )


def test_kv_pool_oom_is_not_a_cuda_oom():
    err = PrefillOutOfMemory(tokens=2056, available=100, evictable=0)
    assert find_cuda_oom(raise_from(err, RuntimeError("scheduler crashed"))) is None


def test_cycle_and_depth_cap_terminate():
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert find_cuda_oom(a) is None
    chain: BaseException = oom()
    for i in range(100):
        nxt = ValueError(str(i))
        nxt.__cause__ = chain
        chain = nxt
    assert find_cuda_oom(chain) is None  # beyond the cap
    assert find_cuda_oom(chain, max_depth=200) is not None


def test_report_prints_the_watermark_only_for_cuda_oom():
    lines: list[str] = []
    fake = FakeAllocator(stats=STATS)
    assert report_cuda_oom(raise_from(oom(), RuntimeError("x")), fake, lines.append)
    assert not report_cuda_oom(RuntimeError("x"), fake, lines.append)
    assert len(lines) == 1 and "frag_gap: 3.49" in lines[0]


def test_context_manager_reports_and_reraises():
    lines: list[str] = []
    with (
        pytest.raises(RuntimeError),
        watermark_on_cuda_oom(FakeAllocator(stats=STATS), lines.append),
    ):
        raise RuntimeError("forward failed") from oom()
    assert lines and lines[0].startswith("CUDA out of memory (OutOfMemoryError); torch mem (GiB)")
