"""The verdict cache (:mod:`policykit.spec.proof_cache`): a key that changes with every input of
the encoding, an entry that is only returned for the very inputs it was stored for, rows that
depend on the machine never stored, and a run that checks a repeated member once."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.config import EngineConfig
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry
from policykit.spec.checker import CheckOptions
from policykit.spec.proof_cache import (
    SCHEMA,
    Member,
    ProofCache,
    RunCache,
    cache_dir,
    key_inputs,
    key_of,
    storable,
)
from policykit.spec.solver import WALL_CLOCK

COMBO = "sglang/sglang/page"


@pytest.fixture(scope="module")
def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager())


def _key(registry: PolicyRegistry, text: str, config: EngineConfig, options: CheckOptions) -> str:
    combo = registry.resolve(text, config=config)
    return key_of(key_inputs(combo, config, options, registry.sources(combo)))


def _row(verdict: str = "proved", note: str = "") -> dict:
    return {"combo": COMBO, "property": "no-oom", "verdict": verdict, "note": note}


def test_the_key_moves_with_every_input_but_the_wall_clock(registry: PolicyRegistry) -> None:
    config, options = EngineConfig(), CheckOptions()
    base = _key(registry, COMBO, config, options)
    assert base == _key(registry, COMBO, config, options)
    assert base == _key(registry, COMBO, config, dataclasses.replace(options, deadline=1e12))
    others = [
        _key(registry, "sglang/sglang/none", config, options),
        _key(registry, COMBO, dataclasses.replace(config, page_size=16), options),
        _key(registry, COMBO, dataclasses.replace(config, sliding_window=4096), options),
        _key(registry, COMBO, config, dataclasses.replace(options, rounds=3)),
        _key(registry, COMBO, config, dataclasses.replace(options, rlimit=1_000_000)),
        _key(registry, "sglang/sglang/checkpoint:256", config, options),
        _key(registry, "sglang/sglang/checkpoint:512", config, options),
    ]
    assert len({base, *others}) == len(others) + 1


def test_the_key_names_the_code_z3_and_the_policies(registry: PolicyRegistry) -> None:
    combo = registry.resolve(COMBO, config=EngineConfig())
    inputs = key_inputs(combo, EngineConfig(), CheckOptions(), registry.sources(combo))
    assert {"checker", "z3", "python", "policykit", "policies", "config", "options"} <= set(inputs)
    assert all(p["code"] and p["class"] for p in inputs["policies"])
    assert "deadline" not in inputs["options"]


def test_an_entry_answers_only_the_inputs_it_was_stored_for(tmp_path: Path) -> None:
    store = ProofCache(tmp_path)
    inputs = {"combo": COMBO, "n": 1}
    key = key_of(inputs)
    store.put(key, inputs, [_row()])
    assert store.get(key, inputs) == [_row()]
    # the same file read for other inputs (as a hash collision would) is a miss, not a verdict
    assert store.get(key, {"combo": COMBO, "n": 2}) is None
    entry = json.loads(next(tmp_path.rglob("*.json")).read_text())
    assert entry["schema"] == SCHEMA and "created" in entry
    assert (store.hits, store.misses, store.stored) == (1, 1, 1)


def test_an_unreadable_entry_is_a_miss(tmp_path: Path) -> None:
    store = ProofCache(tmp_path)
    key = key_of({"a": 1})
    (tmp_path / key[:2]).mkdir()
    (tmp_path / key[:2] / f"{key}.json").write_text("{not json")
    assert store.get(key, {"a": 1}) is None
    assert store.errors and store.misses == 1


def test_rows_that_depend_on_the_machine_are_not_stored(tmp_path: Path) -> None:
    assert storable([_row()])
    assert not storable([])
    assert not storable([_row("refused", "The process checking this combo died")])
    assert not storable([_row("unknown", f"solver: {WALL_CLOCK}")])
    store = ProofCache(tmp_path)
    store.put("ab" * 32, {"a": 1}, [_row("refused")])
    assert store.stored == 0 and not list(tmp_path.rglob("*.json"))


def test_the_cache_dir_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("POLICYKIT_CACHE_DIR", str(tmp_path / "here"))
    assert cache_dir() == tmp_path / "here"
    monkeypatch.delenv("POLICYKIT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "policykit" / "check"


def test_a_run_checks_a_repeated_member_once_and_takes_hits(
    registry: PolicyRegistry, tmp_path: Path
) -> None:
    config, options = EngineConfig(), CheckOptions()
    names = [COMBO, "sglang/sglang/none", COMBO]
    combos = [registry.resolve(n, config=config) for n in names]
    sources = [registry.sources(c) for c in combos]
    members = [Member(c, config, options) for c in combos]
    store = ProofCache(tmp_path)
    run = RunCache.plan(members, sources, store)
    assert run.todo == [0, 1] and run.same_as == {2: 0}
    run.record(0, [_row()])
    run.record(1, [{**_row(), "combo": "sglang/sglang/none"}])
    assert run.all_rows()[2] == run.all_rows()[0]
    again = RunCache.plan([Member(c, config, options) for c in combos], sources, store)
    assert again.todo == [] and again.all_rows() == run.all_rows()
    assert again.summary()["hits"] == 2 and again.summary()["shared"] == 1
    off = RunCache.plan([Member(c, config, options) for c in combos], sources, None)
    assert off.todo == [0, 1] and off.summary() == {"enabled": False, "checked": 2, "shared": 1}


def _check(*flags: str) -> dict:
    out = CliRunner().invoke(main, ["check", "--combo", COMBO, "--json", *flags])
    assert out.exit_code == 1, out.output  # no-starvation is violated
    return json.loads(out.stdout)


def _claims(doc: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in doc["verdicts"]]


@pytest.mark.slow  # three checks of one combo: about 11 s at load 9 on two cores
def test_check_stores_then_reuses_verdicts_and_no_cache_checks_anew() -> None:
    cold = _check()
    assert cold["cache"]["stored"] == 1 and cold["cache"]["hits"] == 0
    warm = _check()
    assert warm["cache"]["hits"] == 1 and warm["cache"]["checked"] == 0
    assert warm["verdicts"] == cold["verdicts"]
    anew = _check("--no-cache")
    assert anew["cache"]["enabled"] is False and anew["cache"]["checked"] == 1
    assert _claims(anew) == _claims(cold)
