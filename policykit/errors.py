"""Errors a user can act on, kept apart from bugs.

Every error here carries a message written for the person at the terminal: the CLI prints it as
one paragraph and exits with a non-zero code instead of showing a traceback. Anything *not*
derived from :class:`PolicykitError` is a bug in policykit and is allowed to surface as one.
"""

from __future__ import annotations

from typing import Any


def quote(value: Any, limit: int = 60) -> str:
    """``repr`` cut to ``limit`` characters: an error message quotes bad input, not all of it
    (a 5000-digit parameter makes an unreadable paragraph)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


class PolicykitError(Exception):
    """Base class of every error caused by input, configuration or a plugin."""


class ScenarioError(PolicykitError):
    """A scenario or trace file is malformed or describes an impossible state."""


class ComboError(PolicykitError):
    """A ``--combo`` string names an unknown policy or a bad parameter."""


class UnfitPolicyError(ComboError):
    """A combo names a policy that exists but cannot run on this engine configuration: its
    constructor raised, or its ``validate`` refused the configuration.

    Unlike a misspelt name this is not the user's typo but the policy's own answer, so a list
    of combos (``check --combos``) reports it as that combo's ``refused`` row and goes on.
    """


class PluginError(PolicykitError):
    """A plugin failed to import, raised while registering, or registered something invalid."""


class PolicyError(PolicykitError):
    """A policy raised or returned a decision the scheduler cannot carry out.

    The message names the policy and where it came from (built-in or the distribution that
    registered it), so a misbehaving third-party policy is identified without a debugger.
    ``request_id`` names the request the policy was deciding on: the scheduler fails that
    request and keeps serving the others (a policy broken for one shape of input should not
    take the node down).
    """

    def __init__(self, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


class PlanError(PolicykitError):
    """A plan handed to ``commit`` does not match the node (unknown request, wrong state,
    token range that is not the request's next one).

    Plans are data and may come from elsewhere (a replay, another pipeline rank); they are
    checked before anything is allocated, so a bad one changes nothing.
    """


class RequestFault(Exception):
    """A fault confined to one request (its host-tier copy failed, say).

    The scheduler rolls the round back, fails ``request_id`` with this message as the reason,
    and plans the round again without it. Not a :class:`PolicykitError`: it is a runtime fault,
    not bad input.
    """

    def __init__(self, message: str, *, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class LoadBackError(RequestFault):
    """Copying a request's host-tier prefix back to the device failed."""


class PrefillOutOfMemory(Exception):
    """The KV pool could not pay for a planned batch: the simulated engine crashes here.

    Deliberately *not* a :class:`PolicykitError`: it is the outcome being studied, not bad
    input. The message mirrors the engine's (SGLang's ``alloc_for_extend``) so that a trace
    from policykit reads like the production log it reproduces.
    """

    def __init__(
        self,
        *,
        tokens: int,
        available: int,
        evictable: int,
        pool: str = "full",
        request: str | None = None,
    ):
        self.tokens = tokens
        self.request = request
        self.available = available
        self.evictable = evictable
        self.pool = pool
        super().__init__(self.message)

    @property
    def message(self) -> str:
        total = self.available + self.evictable
        return (
            "Prefill out of memory. Try to lower your batch size.\n"
            f"Try to allocate {self.tokens} tokens.\n"
            f"Available {self.pool} tokens: {total} "
            f"({self.pool}_available_size={self.available} + "
            f"{self.pool}_evictable_size_={self.evictable})"
        )
