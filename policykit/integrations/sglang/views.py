"""The policies' views, built for the hot path: the same public classes, a cheaper constructor.

A policy inside SGLang must receive exactly what it receives in ``policykit simulate``: an
instance of :class:`~policykit.policy.AdmitView`, :class:`~policykit.policy.ChunkView` or
:class:`~policykit.policy.QueueView`, the views asked on every decision (a truncation's
:class:`~policykit.policy.AlignView` and :class:`~policykit.policy.TailView`, asked at most
once a round, are built by :mod:`policykit.kernel` with their own constructors). Those are frozen
dataclasses, and a frozen dataclass's generated ``__init__`` stores every field through
``object.__setattr__``, one call per field. Per decision that was the largest cost the plugin
added to SGLang's planning round (about 4 µs for a 7-field ``AdmitView`` on the 2-core CI
machine, against about 11 µs for upstream's whole ``_select_prefill_admission``).

Each builder here makes the instance with ``object.__new__`` and installs its field dict in
one step. The result is indistinguishable from the constructor's: same class, same fields in
the same order, equal and hash-equal to ``Cls(...)``, still frozen, same ``repr``.
``tests/upstream/test_sglang_plugin_views.py`` holds each builder to its class's fields, so a
field added to a view fails there rather than inside an engine.
"""

from __future__ import annotations

from policykit.policy import AdmitView, ChunkView, QueueView

_new = object.__new__
_install = object.__setattr__


def admit_view(
    prompt_tokens: int,
    remaining_tokens: int,
    host_prefix_tokens: int,
    first_tokens: int,
    page_size: int,
    rem_total_tokens: int,
    cur_rem_tokens: int,
    hybrid_swa: bool = False,
    rem_swa_tokens: int = 0,
    swa_need: int = 0,
    swa_pool_tokens: int = 0,
    swa_chunk_cap: int = 0,
) -> AdmitView:
    view = _new(AdmitView)
    _install(
        view,
        "__dict__",
        {
            "prompt_tokens": prompt_tokens,
            "remaining_tokens": remaining_tokens,
            "host_prefix_tokens": host_prefix_tokens,
            "first_tokens": first_tokens,
            "page_size": page_size,
            "rem_total_tokens": rem_total_tokens,
            "cur_rem_tokens": cur_rem_tokens,
            "hybrid_swa": hybrid_swa,
            "rem_swa_tokens": rem_swa_tokens,
            "swa_need": swa_need,
            "swa_pool_tokens": swa_pool_tokens,
            "swa_chunk_cap": swa_chunk_cap,
        },
    )
    return view


def chunk_view(
    remaining_tokens: int,
    rem_chunk_tokens: int,
    rem_total_tokens: int,
    rem_swa_tokens: int,
    page_size: int,
    hybrid_swa: bool,
    swa_need: int = 0,
    swa_pool_tokens: int = 0,
    swa_chunk_cap: int = 0,
    eligible_requests: int = 1,
) -> ChunkView:
    view = _new(ChunkView)
    _install(
        view,
        "__dict__",
        {
            "remaining_tokens": remaining_tokens,
            "rem_chunk_tokens": rem_chunk_tokens,
            "rem_total_tokens": rem_total_tokens,
            "rem_swa_tokens": rem_swa_tokens,
            "page_size": page_size,
            "hybrid_swa": hybrid_swa,
            "swa_need": swa_need,
            "swa_pool_tokens": swa_pool_tokens,
            "swa_chunk_cap": swa_chunk_cap,
            "eligible_requests": eligible_requests,
        },
    )
    return view


def queue_view(
    prompt_tokens: int,
    prefix_tokens: int,
    host_prefix_tokens: int,
    page_size: int,
    priority: int = 0,
    arrival: int = 0,
) -> QueueView:
    """SGLang's requests carry no priority the queue policies read (its own priority
    scheduling is refused at start-up) and no arrival stamps: both 0, as on policykit's node."""
    view = _new(QueueView)
    _install(
        view,
        "__dict__",
        {
            "prompt_tokens": prompt_tokens,
            "prefix_tokens": prefix_tokens,
            "host_prefix_tokens": host_prefix_tokens,
            "page_size": page_size,
            "priority": priority,
            "arrival": arrival,
        },
    )
    return view


#: each builder and the view class it builds (for the tests that hold them to the fields)
BUILDERS = (
    (admit_view, AdmitView),
    (chunk_view, ChunkView),
    (queue_view, QueueView),
)
