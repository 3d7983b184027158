"""Which combo the vLLM scheduler class runs, and the engine settings it is derived from.

The combo comes from, in order: the ``policykit_combo`` key of vLLM's ``--additional-config``
(one engine's own setting, in its launch command), ``POLICYKIT_COMBO``, the file named by
``POLICYKIT_CONFIG`` (read as the SGLang plugin reads it), and otherwise vLLM's own decisions
under the engine's configuration, :func:`derived_combo`. Kinds a setting does not name are
taken from :func:`derived_combo` too, not from policykit's SGLang-shaped defaults:
``queue=lpm`` alone means this engine's vLLM with its waiting queue ordered by cached prefix.
The vLLM releases the class runs on are :data:`policykit.engines.RELEASES`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from policykit.errors import ComboError
from policykit.integrations.sglang import settings as shared

#: the key of ``--additional-config`` that names the combo
CONFIG_KEY = "policykit_combo"
COMBO_ENV = shared.COMBO_ENV
CONFIG_ENV = shared.CONFIG_ENV
CHECK_ENV = shared.CHECK_ENV
#: vLLM 0.33.0's own decisions under its default settings (:func:`derived_combo` of them)
VLLM_COMBO = {
    "admission": "vllm",
    "chunking": "vllm",
    "alignment": "none",
    "allocator-phase": "default",
    "queue": "fcfs",
    "preemption": "vllm",
}


def derived_combo(vllm_config: Any) -> dict[str, str]:
    """vLLM 0.33.0's own decisions under ``vllm_config``, one policy per kind.

    ``Scheduler.schedule`` reads these fields of ``vllm_config.scheduler_config`` for the
    decisions policies own, and nothing else of the configuration changes them:

    * ``policy``: ``fcfs`` orders the waiting queue by arrival (queue ``fcfs``) and preempts
      ``running[-1]`` (preemption ``vllm``); ``priority`` orders it by ``Request.__lt__``
      (queue ``priority``) and preempts ``max(running, key=(priority, arrival_time))``
      (preemption ``vllm-priority``);
    * ``long_prefill_token_threshold`` (``N`` > 0: chunking ``vllm-threshold:N``) and
      ``long_prefill_token_threshold_adaptive`` (the threshold floored at
      ``max_num_batched_tokens // eligible requests``: ``vllm-adaptive:N@B``, ``B``
      being ``max_num_batched_tokens``);
    * ``enable_chunked_prefill`` (off: chunking ``vllm-no-chunk``, a waiting request enters
      whole or waits);
    * ``scheduler_reserve_full_isl`` (off: admission ``vllm-no-reserve``).

    Alignment is ``none`` (vLLM ends a chunk anywhere; its Mamba alignment is left to vLLM, as
    the scheduler class leaves such models alone) and the allocator phase ``default``. Chunked
    prefill off together with a threshold (vLLM caps a waiting request at the threshold, then
    asks whether that chunk fits) is a rule no built-in expresses: refused (ComboError).
    """
    sched = vllm_config.scheduler_config
    combo = dict(VLLM_COMBO)
    if sched.policy == "priority":
        combo["queue"], combo["preemption"] = "priority", "vllm-priority"
    threshold = int(sched.long_prefill_token_threshold)
    if not sched.enable_chunked_prefill:
        if threshold > 0:
            raise ComboError(
                f"vLLM runs with chunked prefill off and long_prefill_token_threshold="
                f"{threshold}: it cuts a waiting request to the threshold and then admits it "
                "only if that chunk fits, a rule none of policykit's chunking policies "
                "expresses (vllm-no-chunk admits a request whole or not at all, "
                "vllm-threshold chunks it whenever the budget is short); turn chunked prefill "
                "on, drop the threshold, or name a chunking policy of your own in "
                f"{CONFIG_KEY}."
            )
        combo["chunking"] = "vllm-no-chunk"
    elif threshold > 0 and sched.long_prefill_token_threshold_adaptive:
        combo["chunking"] = f"vllm-adaptive:{threshold}@{sched.max_num_batched_tokens}"
    elif threshold > 0:
        combo["chunking"] = f"vllm-threshold:{threshold}"
    if not sched.scheduler_reserve_full_isl:
        combo["admission"] = "vllm-no-reserve"
    return combo


def engine_settings(vllm_config: Any) -> dict[str, Any]:
    """The engine's settings that decide whether a listed release's unmodelled behaviours
    matter (:func:`policykit.engines.unmodelled_refusal`); a field a release lacks reads as its
    default there (0.33.0 has no cache-aware admission window and no load cap)."""
    sched = vllm_config.scheduler_config
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    return {
        "policy": str(sched.policy),
        "enable_prefix_caching": bool(vllm_config.cache_config.enable_prefix_caching),
        "enable_chunked_prefill": bool(sched.enable_chunked_prefill),
        "long_prefill_token_threshold": int(sched.long_prefill_token_threshold),
        "cache_aware_admission_window": int(getattr(sched, "cache_aware_admission_window", 0)),
        "kv_connector": bool(transfer is not None and getattr(transfer, "kv_connector", None)),
        "max_num_inflight_kv_loads": getattr(sched, "max_num_inflight_kv_loads", None),
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
