"""vLLM's real v1 scheduler admits a prefill it can never complete, on a CPU, in two steps.

A standalone reproducer: it imports vLLM and the standard library only, so an upstream
maintainer can copy this one file and run it (``python vllm_stall.py reservation-off``, or
``python -m policykit.findings.repro.vllm_stall threshold`` from policykit). It builds vLLM's own
``Scheduler`` as vLLM's CPU unit tests do (``tests/v1/core/utils.py create_scheduler``: a
``VllmConfig``, one full-attention KV group, no tensors, a one-layer model config written to a
temporary folder, nothing downloaded) with a KV connector in the producer role, the prefill side
of a disaggregated deployment, that holds every finished request's blocks, as a connector does
until the decode side has pulled them. Here the decode side never pulls, so that KV is held for
good. Each step is ``schedule()`` then ``update_from_output()`` with a hand-made model output:
a request whose prompt is computed samples one token and, with ``max_tokens=1``, finishes.

What the script prints is read from vLLM's own objects: the ``SchedulerOutput`` of each step
(tokens scheduled, preempted request ids), the block pool's free count, and at the end each
request's ``status``, ``num_computed_tokens``, ``num_preemptions``, the blocks the KV cache
manager holds for it, and whether it sits in ``running`` or ``waiting``.

Scenarios (the counterexamples ``policykit check`` found, shrunk, on vLLM's own combos):

* ``reservation-off``: ``scheduler_reserve_full_isl=False``. A (64 tokens) finishes in step 1
  and holds its one block; B (4096 tokens, the whole 64-block pool) enters beside it on its first
  chunk (4032 tokens), cannot get its last block in step 2, preempts itself, and waits for good.
* ``threshold``: vLLM's default reservation on, ``long_prefill_token_threshold=256``. A and B
  (320 tokens each, 9 blocks of 64) both enter in step 1 with 256 tokens each (each one's whole
  prompt fitted the free blocks when it was checked); in step 2 A finishes, B cannot get its
  last block, preempts itself, and its whole prompt never fits again beside A's held KV.

``--settings default`` runs the same scenario with vLLM's defaults (reservation on, no
threshold): there the long request is never admitted, so nothing is computed and thrown away.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

#: steps run after the last one in which anything changed, to show that nothing does
IDLE_STEPS = 5
_MODEL = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 1,
    "vocab_size": 1024,
    "max_position_embeddings": 1 << 20,
    "torch_dtype": "float32",
}


@dataclass(frozen=True)
class Scenario:
    """One reproducer: the pool, the step budget, vLLM's settings and the requests."""

    name: str
    block_size: int
    #: usable blocks (vLLM's null block comes on top)
    blocks: int
    budget: int
    reserve_full_isl: bool
    threshold: int
    #: (request id, prompt tokens), all arriving before step 1, in this order
    requests: tuple[tuple[str, int], ...]
    #: the request the scenario is about: admitted, preempted, never finished
    blamed: str
    what: str = ""


SCENARIOS = {
    "reservation-off": Scenario(
        "reservation-off", 64, 64, 4096, False, 0, (("A", 64), ("B", 4096)), "B",
        "scheduler_reserve_full_isl=False",
    ),
    "threshold": Scenario(
        "threshold", 64, 9, 4096, True, 256, (("A", 320), ("B", 320)), "B",
        "scheduler_reserve_full_isl=True (default), long_prefill_token_threshold=256",
    ),
}  # fmt: skip


class HoldKVConnector(KVConnectorBase_V1):
    """The producer side of a disaggregated deployment: every finished request's blocks wait
    for a transfer to decode, which this run never reports done."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external: int) -> None:
        return None

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: list[int]) -> Any:
        return True, None  # free the blocks once the transfer is done (never, here)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        raise NotImplementedError

    def wait_for_save(self) -> None:
        raise NotImplementedError


def _model_dir() -> str:
    folder = Path(tempfile.mkdtemp(prefix="vllm-repro-model-"))
    (folder / "config.json").write_text(json.dumps(_MODEL), encoding="utf-8")
    return str(folder)


def build_scheduler(sc: Scenario) -> Any:
    """vLLM's own ``Scheduler`` for ``sc``, on a CPU, with no KV tensors."""
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

    longest = max(n for _, n in sc.requests) + 1
    model = ModelConfig(
        model=_model_dir(), skip_tokenizer_init=True, dtype="float32", max_model_len=longest
    )
    sched = SchedulerConfig(
        max_num_seqs=len(sc.requests) + 1,
        max_num_batched_tokens=sc.budget,
        max_model_len=longest,
        is_encoder_decoder=False,
        long_prefill_token_threshold=sc.threshold,
        enable_chunked_prefill=True,
        scheduler_reserve_full_isl=sc.reserve_full_isl,
    )
    cache = CacheConfig(block_size=sc.block_size, enable_prefix_caching=True)
    cache.num_gpu_blocks = sc.blocks + 1
    transfer = KVTransferConfig(
        kv_connector=HoldKVConnector.__name__,
        kv_connector_module_path=HoldKVConnector.__module__,
        kv_role="kv_producer",
    )
    config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        model_config=model,
        scheduler_config=sched,
        cache_config=cache,
        kv_transfer_config=transfer,
    )
    spec = FullAttentionSpec(
        block_size=sc.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
    )
    groups = [KVCacheGroupSpec(["layer"], spec)]
    kv = KVCacheConfig(num_blocks=sc.blocks + 1, kv_cache_tensors=[], kv_cache_groups=groups)
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=sc.block_size,
        log_stats=False,
    )


def _add_requests(sched: Any, sc: Scenario) -> None:
    """Each request with its own token ids (no shared prefix), ``max_tokens=1``."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(sc.block_size, sha256)
    for i, (rid, n) in enumerate(sc.requests):
        base = (i + 1) << 16
        sched.add_request(
            Request(
                request_id=rid,
                prompt_token_ids=list(range(base, base + n)),
                sampling_params=SamplingParams(max_tokens=1, ignore_eos=True),
                pooling_params=None,
                arrival_time=float(i),
                block_hasher=hasher,
            )
        )


def _runner_output(sched: Any, out: Any) -> Any:
    """What a model runner returns: one sampled token for each request whose prompt is done."""
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(out.num_scheduled_tokens)
    done = {
        rid
        for rid in ids
        if sched.requests[rid].num_computed_tokens >= sched.requests[rid].num_prompt_tokens
    }
    index: dict[str, Any] = {}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        index["req_id_to_index"] = {rid: i for i, rid in enumerate(ids)}  # gone in 0.34.0
    return ModelRunnerOutput(
        req_ids=ids, **index, sampled_token_ids=[[0] if r in done else [] for r in ids]
    )


@dataclass
class Run:
    """What the engine showed: one record per step, and its state at the end."""

    scenario: Scenario
    version: str
    steps: list[dict[str, Any]] = field(default_factory=list)
    state: dict[str, Any] = field(default_factory=dict)


def _step(sched: Any, number: int) -> dict[str, Any]:
    out = sched.schedule()
    record = {
        "step": number,
        "scheduled": dict(out.num_scheduled_tokens),
        "preempted": sorted(out.preempted_req_ids or ()),
        "free_blocks": sched.kv_cache_manager.block_pool.get_num_free_blocks(),
    }
    sched.update_from_output(out, _runner_output(sched, out))
    return record


def _state(sched: Any) -> dict[str, Any]:
    """Each request as vLLM's scheduler holds it, and the pool."""
    running = [r.request_id for r in sched.running]
    waiting = [r.request_id for r in sched.waiting]
    requests = {}
    for rid, req in sched.requests.items():
        blocks = sched.kv_cache_manager.get_block_ids(rid)
        requests[rid] = {
            "status": req.status.name,
            "queue": "running" if rid in running else "waiting" if rid in waiting else "-",
            "num_computed_tokens": req.num_computed_tokens,
            "num_prompt_tokens": req.num_prompt_tokens,
            "num_preemptions": req.num_preemptions,
            "blocks_held": len(blocks[0]) if blocks else 0,
        }
    pool = sched.kv_cache_manager.block_pool
    return {"requests": requests, "free_blocks": pool.get_num_free_blocks()}


def reproduce(name: str, *, defaults: bool = False) -> Run:
    """Run scenario ``name`` on the installed vLLM (``defaults``: with vLLM's default settings
    instead of the scenario's); stop :data:`IDLE_STEPS` steps after the last change."""
    import vllm

    logging.getLogger("vllm").setLevel(logging.ERROR)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sc = SCENARIOS[name]
    if defaults:
        sc = dataclasses.replace(sc, reserve_full_isl=True, threshold=0, what="vLLM's defaults")
    sched = build_scheduler(sc)
    _add_requests(sched, sc)
    run = Run(sc, vllm.__version__)
    idle = 0
    while idle < IDLE_STEPS and len(run.steps) < 50:
        record = _step(sched, len(run.steps) + 1)
        run.steps.append(record)
        idle = 0 if record["scheduled"] or record["preempted"] else idle + 1
    run.state = _state(sched)
    return run


def failed(run: Run) -> bool:
    """The failure: the blamed request computed tokens, was preempted, and is unfinished while
    the last steps schedule nothing at all."""
    rid = run.scenario.blamed
    computed = any(s["scheduled"].get(rid) for s in run.steps)
    preempted = any(rid in s["preempted"] for s in run.steps)
    req = run.state["requests"][rid]
    tail = run.steps[-IDLE_STEPS:]
    idle = all(not s["scheduled"] and not s["preempted"] for s in tail)
    return computed and preempted and not req["status"].startswith("FINISHED") and idle


def report(run: Run) -> list[str]:
    """The run as text, every figure read from vLLM's objects."""
    sc = run.scenario
    lines = [
        f"vLLM {run.version}: {sc.what}; {sc.blocks} blocks of {sc.block_size} tokens, "
        f"max_num_batched_tokens={sc.budget}; prompts "
        + ", ".join(f"{rid}={n}" for rid, n in sc.requests)
        + "; finished requests' KV held by the connector (never released)"
    ]
    for s in run.steps:
        lines.append(
            f"step {s['step']:>2}: scheduled {s['scheduled'] or '{}'}"
            f"{'  preempted ' + ','.join(s['preempted']) if s['preempted'] else ''}"
            f"  free blocks {s['free_blocks']}"
        )
    lines.append(f"after step {len(run.steps)} (free blocks {run.state['free_blocks']}):")
    for rid, r in run.state["requests"].items():
        lines.append(
            f"  {rid}: {r['status']} in {r['queue']}, num_computed_tokens "
            f"{r['num_computed_tokens']}/{r['num_prompt_tokens']}, num_preemptions "
            f"{r['num_preemptions']}, blocks held {r['blocks_held']}"
        )
    rid = sc.blamed
    if failed(run):
        lines.append(
            f"STRANDED: {rid} was admitted, computed tokens, preempted itself, and no step "
            f"schedules anything for the last {IDLE_STEPS} steps."
        )
    else:
        lines.append(f"not stranded: {rid} was not admitted and then left unfinished here.")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Print the run; exit 1 when the blamed request is stranded, 0 when it is not."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--settings", choices=["scenario", "default"], default="scenario")
    args = parser.parse_args(argv)
    run = reproduce(args.scenario, defaults=args.settings == "default")
    print("\n".join(report(run)))
    return 1 if failed(run) else 0


if __name__ == "__main__":
    sys.exit(main())
