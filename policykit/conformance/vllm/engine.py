"""Building vLLM's real v1 ``Scheduler`` on a CPU, offline, with no KV tensors.

This follows vLLM's own CPU unit tests (``tests/v1/core/utils.py create_scheduler``): a
``VllmConfig`` and a ``KVCacheConfig`` with one ``FullAttentionSpec`` group and no tensors, so
the block pool, prefix cache and every scheduling decision are vLLM's code while nothing is
ever computed. The model is a one-layer Llama ``config.json`` written to a temporary folder
(``skip_tokenizer_init``, ``HF_HUB_OFFLINE``): no download, no weights, no tokenizer.

Written against vLLM 0.33.0; which releases it runs on is :data:`policykit.engines.RELEASES`
(:func:`release`), and an unlisted one is refused unless ``POLICYKIT_ASSUME_VLLM`` names one.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from policykit import engines

_MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 1 << 26,
    "torch_dtype": "float32",
}

INSTALL_HINT = engines.written_against("vllm").install


class VllmUnavailable(RuntimeError):
    """vLLM's scheduler cannot be imported here (the ``vllm`` extra is not installed), or the
    installed release is not one :data:`policykit.engines.RELEASES` lists."""


#: the values of vLLM's ``--scheduling-policy`` (its ``SchedulerConfig.policy``)
SchedulingPolicyName = Literal["fcfs", "priority"]


@dataclass(frozen=True)
class SchedulerKnobs:
    """The vLLM settings a scenario has no field for: vLLM's own defaults unless overridden."""

    long_prefill_token_threshold: int = 0
    scheduler_reserve_full_isl: bool = True
    #: None: as many as the scenario has requests, so the cap never binds (policykit has none)
    max_num_seqs: int | None = None
    enable_prefix_caching: bool = True
    #: vLLM's ``--scheduling-policy``: ``fcfs`` or ``priority`` (every request's priority 0)
    scheduling_policy: SchedulingPolicyName = "fcfs"


def load() -> Any:
    """Import vLLM's scheduler module, or raise :class:`VllmUnavailable` saying how to install."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # vLLM warns about its missing CUDA extension, and about the KV connector's limits on every
    # scheduler it builds, through loggers it leaves unconfigured here: none of it is about the
    # decisions compared, and a conformance run would print it hundreds of times
    logging.getLogger("vllm").setLevel(logging.ERROR)
    try:
        import vllm.v1.core.sched.scheduler as scheduler_module
    except ImportError as exc:
        raise VllmUnavailable(
            f"vLLM's scheduler cannot be imported ({exc}); install it with {INSTALL_HINT}"
        ) from None
    release()
    return scheduler_module


def release() -> engines.Resolved:
    """The installed vLLM's entry in :data:`policykit.engines.RELEASES` (or the one
    ``POLICYKIT_ASSUME_VLLM`` names); :class:`VllmUnavailable` when there is none."""
    found = engines.installed_version("vllm")
    if found is None:
        raise VllmUnavailable(f"vLLM is not installed; install it with {INSTALL_HINT}")
    try:
        return engines.resolve("vllm", found)
    except engines.UnsupportedVersion as exc:
        raise VllmUnavailable(str(exc)) from None


def settings_of(knobs: SchedulerKnobs) -> dict[str, Any]:
    """The settings :func:`build_scheduler` gives vLLM under ``knobs``, as
    :func:`policykit.engines.unmodelled_refusal` reads them: chunked prefill on, a KV
    connector that holds finished requests' blocks (no loads, no load cap), no cache-aware
    admission window."""
    return {
        "policy": knobs.scheduling_policy,
        "enable_prefix_caching": knobs.enable_prefix_caching,
        "enable_chunked_prefill": True,
        "long_prefill_token_threshold": knobs.long_prefill_token_threshold,
        "cache_aware_admission_window": 0,
        "kv_connector": True,
        "max_num_inflight_kv_loads": None,
    }


def _model_dir() -> str:
    """A folder holding the small model's config.json (written once per process)."""
    folder = Path(tempfile.gettempdir()) / "policykit-vllm-model"
    folder.mkdir(exist_ok=True)
    path = folder / "config.json"
    if not path.exists():
        # written aside and renamed: parallel test workers may build schedulers at once
        partial = folder / f"config.json.{os.getpid()}"
        partial.write_text(json.dumps(_MODEL_CONFIG), encoding="utf-8")
        os.replace(partial, path)
    return str(folder)


def build_scheduler(
    *,
    block_size: int,
    num_blocks: int,
    budget: int,
    max_model_len: int,
    max_num_seqs: int,
    knobs: SchedulerKnobs,
    scheduler_cls: type | None = None,
    additional_config: dict[str, Any] | None = None,
) -> Any:
    """A real ``Scheduler`` whose pool has ``num_blocks`` blocks (one is vLLM's null block);
    ``scheduler_cls`` builds a subclass instead (what ``--scheduler-cls`` names), as vLLM's
    engine core would, with ``additional_config`` as ``--additional-config``."""
    load()
    import torch
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        SchedulerConfig,
        VllmConfig,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from policykit.conformance.vllm.connector import MODULE_PATH, HoldKVConnector

    model = ModelConfig(
        model=_model_dir(), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len
    )
    scheduler_config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        is_encoder_decoder=False,
        long_prefill_token_threshold=knobs.long_prefill_token_threshold,
        enable_chunked_prefill=True,
        scheduler_reserve_full_isl=knobs.scheduler_reserve_full_isl,
        policy=knobs.scheduling_policy,
    )
    cache = CacheConfig(block_size=block_size, enable_prefix_caching=knobs.enable_prefix_caching)
    cache.num_gpu_blocks = num_blocks
    transfer = KVTransferConfig(
        kv_connector=HoldKVConnector.__name__,
        kv_connector_module_path=MODULE_PATH,
        kv_role="kv_producer",
    )
    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        model_config=model,
        scheduler_config=scheduler_config,
        cache_config=cache,
        kv_transfer_config=transfer,
        additional_config=additional_config or {},
    )
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    kv_cache = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )
    return (scheduler_cls or Scheduler)(
        vllm_config=config,
        kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block_size,
        log_stats=False,
    )
