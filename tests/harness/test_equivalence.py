"""Policies change *when* tokens are computed, never *what*: for every combination, every
request's first-token logits equal a dense unchunked forward of its prompt (fp32: 1e-4 of the
logit scale)."""

from __future__ import annotations

import pytest
import torch

from policykit.harness.build import PrefixKV
from policykit.harness.runner import from_workload, run_combo
from policykit.harness.workloads import Workload
from policykit.plan import EntryKind
from policykit.registry import PolicyRegistry

REL = 1e-4


@pytest.fixture(scope="module")
def dense_logits(store: PrefixKV, coverage_workload: Workload) -> dict[str, torch.Tensor]:
    model = store.model
    return {
        rid: model.dense(model.token_ids(tokens)).logits
        for rid, tokens in coverage_workload.tokens().items()
    }


def test_every_combo_computes_the_dense_logits(
    registry: PolicyRegistry,
    store: PrefixKV,
    coverage_workload: Workload,
    dense_logits: dict[str, torch.Tensor],
) -> None:
    bench = from_workload(coverage_workload)
    combos = list(registry.all_combos(bench.config))
    assert len(combos) >= 27
    paths: set[str] = set()
    checked = 0
    for combo in combos:
        seen: list = []
        run = run_combo(bench, combo, store, keep_logits=True, on_round=seen.append)
        assert run.logits, f"{combo}: no request finished"
        assert len(run.logits) == run.row["requests"]["completed"]
        for rid, logits in run.logits.items():
            ref = dense_logits[rid]
            err = float((logits - ref).abs().max() / ref.abs().max())
            assert err < REL, f"{combo}: {rid} differs from the dense forward by {err:.2e}"
            checked += 1
        for record in seen:
            for entry in record.plan.batch:
                if entry.kind in (EntryKind.TRUNCATED, EntryKind.RESUMED, EntryKind.FINAL):
                    paths.add("chunked")
                if entry.cached:
                    paths.add(f"prefix-hit:{entry.request_id}")
                if entry.load_back:
                    paths.add(f"load-back:{entry.request_id}")
    # the test is only meaningful if these paths actually ran
    assert {"chunked", "prefix-hit:dev", "prefix-hit:cold2", "load-back:host"} <= paths
    assert {"prefix-hit:both", "load-back:both"} <= paths
    assert checked >= 5 * len(combos)


def test_scenario_files_run_on_real_kv(tmp_path, registry: PolicyRegistry, store: PrefixKV) -> None:
    """A scenario's cached prefix, host run and in-progress request all carry the dense KV."""
    import json

    from policykit.harness.runner import from_scenario

    path = tmp_path / "s.json"
    path.write_text(
        json.dumps(
            {
                "name": "kv-paths",
                "page_size": 64,
                "chunked_prefill_size": 256,
                "pool": {"free_tokens": 1536, "evictable_tokens": 128},
                "kv_release_rounds": 1,
                "requests": [
                    {"id": "mid", "prompt_tokens": 500, "chunked": True, "computed_tokens": 300},
                    {
                        "id": "dev",
                        "prompt_tokens": 300,
                        "device_prefix_tokens": 128,
                        "host_prefix_tokens": 100,
                    },
                    {
                        "id": "pin",
                        "prompt_tokens": 200,
                        "device_prefix_tokens": 64,
                        "device_prefix_pinned": True,
                    },
                ],
            }
        )
    )
    bench = from_scenario(path)
    run = run_combo(bench, registry.resolve(None), store, keep_logits=True)
    assert set(run.logits) == {"mid", "dev", "pin"}
    node = bench.make_node(store)
    model = store.model
    for rid, logits in run.logits.items():
        ref = model.dense(model.token_ids(node.requests[rid].tokens)).logits
        assert float((logits - ref).abs().max() / ref.abs().max()) < REL, rid
