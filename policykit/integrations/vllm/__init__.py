"""policykit as vLLM's scheduler class: a combo's policies decide inside vLLM 0.33.0's v1 scheduler.

vLLM takes a custom scheduler as a whole class (``--scheduler-cls``). The one to name is
:class:`PolicyAsyncScheduler`, which extends ``AsyncScheduler``, the class vLLM builds by
default (with async scheduling on); :class:`PolicyScheduler` extends ``Scheduler`` for an
engine started with ``--no-async-scheduling``. Both change the decisions through the same
mixin (:mod:`.scheduler`); see docs/deploy-vllm.md.

Importing this package does not import vLLM: the classes are loaded when vLLM (or anyone)
asks for them by name.
"""

from __future__ import annotations

from typing import Any

#: the classes ``--scheduler-cls policykit.integrations.vllm.<name>`` can name
SCHEDULER_CLASSES = ("PolicyAsyncScheduler", "PolicyScheduler")


def __getattr__(name: str) -> Any:
    if name in SCHEDULER_CLASSES:
        from policykit.integrations.vllm import scheduler

        return getattr(scheduler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
