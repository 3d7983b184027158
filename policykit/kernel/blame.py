"""Who to blame for a broken answer: a policy fault names the policy, its distribution, the
method's file and line and the request it was deciding on, so a plugin's author is sent to
the line that answered. Shared by the planner, the vLLM plugin and the checker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from policykit.errors import PolicyError
from policykit.policy import Policy, defined_at


def describe(policy: Policy, method: str | None = None) -> str:
    """``The chunking policy 'defer' (built-in)``: who to blame, for error messages; with
    ``method``, also the policy's module and the file and line that define the method, so a
    third-party plugin's author is sent to the line that answered."""
    who = f"The {policy.kind} policy {policy.spec!r} ({policy.source})"
    if method is None:
        return who
    where = defined_at(getattr(policy, method))
    return f"{who}, module {type(policy).__module__}, {method}() at {where},"


def ask(policy: Policy, method: Callable[..., Any], view: Any, request_id: str) -> Any:
    """Call a policy, turning its exceptions into a :class:`PolicyError` that names it, its
    distribution and the request it was deciding on."""
    try:
        return method(view)
    except PolicyError:
        raise
    except Exception as exc:
        raise PolicyError(
            f"{describe(policy, method.__name__)} raised {type(exc).__name__}: {exc} at "
            f"{_raised_at(exc)} (while deciding on request {request_id!r}: {view}).",
            request_id=request_id,
        ) from exc


def _raised_at(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of ``exc``'s traceback: the line that raised."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return "?" if tb is None else f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
