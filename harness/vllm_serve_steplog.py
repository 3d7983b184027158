"""Scheduler classes for the real-server check: vLLM's and policykit's, each with a step log.

``vllm serve`` runs its scheduler in the engine-core process, out of reach of the client, so
the check reads what each step scheduled from the server's log. Both sides get the same
:class:`StepLog` mixin and nothing else: :class:`LoggedScheduler` is vLLM's own ``Scheduler``
and :class:`LoggedPolicyScheduler` is policykit's ``PolicyScheduler`` (``Scheduler``, not
``AsyncScheduler``: vLLM's CPU platform turns async scheduling off, so its engine core runs
the synchronous loop that ``Scheduler`` is written for).

The mixin also holds the first step back until :data:`REQUESTS_ENV` requests have arrived, so
that both servers start from the same waiting queue whatever the HTTP timing: it reports no
requests to the engine core until then, and the engine core waits on its input queue, as it
does when idle. From the first step on the step order only depends on the arrival order
(logged, so the check can confirm it), the prompts and ``max_tokens``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING, Any

from vllm.v1.core.sched.scheduler import Scheduler

from policykit.harness.vllm_serve_verdicts import ARRIVED, REQUESTS_ENV, STEP
from policykit.integrations.vllm.scheduler import PolicyScheduler
from policykit.integrations.vllm.startup import route_logs

logger = logging.getLogger("policykit.vllm.serve_steplog")

# A mixin over vLLM's ``Scheduler`` (it extends its methods through super()): a ``Scheduler``
# to the type checker, a plain mixin at run time (each class below picks its base).
if TYPE_CHECKING:
    _SchedulerMixin = Scheduler
else:
    _SchedulerMixin = object


class StepLog(_SchedulerMixin):
    """Logs each step's tokens per request, keyed by prompt length (ids are random per run);
    holds the first step until the expected requests are in."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        route_logs()
        self._expected = int(os.environ.get(REQUESTS_ENV, "0") or 0)
        self._arrivals: list[int] = []

    def add_request(self, request: Any) -> None:
        super().add_request(request)
        if len(self._arrivals) < self._expected:
            self._arrivals.append(request.num_prompt_tokens)
            if len(self._arrivals) == self._expected:
                logger.info("%s %s", ARRIVED, json.dumps(self._arrivals))

    def has_requests(self) -> bool:
        return len(self._arrivals) >= self._expected and super().has_requests()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)
        preempted = out.preempted_req_ids or ()
        if out.total_num_scheduled_tokens or preempted:
            length = self._prompt_length
            step = {
                "scheduled": [[length(r), n] for r, n in out.num_scheduled_tokens.items()],
                "preempted": sorted(length(r) for r in preempted),
            }
            logger.info("%s %s", STEP, json.dumps(step, separators=(",", ":")))
        return out

    def _prompt_length(self, request_id: str) -> int:
        return self.requests[request_id].num_prompt_tokens


class LoggedScheduler(StepLog, Scheduler):
    """vLLM's own ``Scheduler`` with the step log: the baseline."""


class LoggedPolicyScheduler(StepLog, PolicyScheduler):
    """policykit's ``PolicyScheduler`` with the same step log."""
