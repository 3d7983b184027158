"""One engine configuration record, one name per quantity, and the former names still read."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.config import EngineConfig, current_keys
from policykit.errors import ScenarioError
from policykit.scenario import load_scenario, parse_scenario
from policykit.spec.checker import CheckOptions
from policykit.spec.report import from_unit_args, unit_args

HYBRID = EngineConfig(16, 789, sliding_window=4096, max_prefill_tokens=2048, kv_release_rounds=1)


def _scenario(**top) -> dict:
    return {
        "page_size": 64,
        "chunked_prefill_size": 4096,
        "pool": {"free_tokens": 1920, "swa_free_tokens": 1281},
        "requests": [{"id": "A", "prompt_tokens": 1850}],
        **top,
    }


def test_hybrid_swa_is_whether_there_is_a_window():
    assert not EngineConfig().hybrid_swa
    assert HYBRID.hybrid_swa


def test_the_record_round_trips_and_reads_the_former_key_names():
    assert EngineConfig.from_dict(HYBRID.to_dict()) == HYBRID
    old = {"page_size": 16, "chunk_size": 789, "swa_window": 4096, "rounds": 4}
    assert EngineConfig.from_dict(old) == EngineConfig(16, 789, sliding_window=4096)


def test_the_current_key_wins_over_a_former_one():
    assert current_keys({"swa_window": 1, "sliding_window": 2}) == {"sliding_window": 2}


def test_a_scenario_reads_the_window_at_the_top_or_in_the_pool_and_writes_it_at_the_top():
    new = parse_scenario(_scenario(sliding_window=4096))
    pool = _scenario()
    pool["pool"] = {**pool["pool"], "sliding_window": 4096}
    old = parse_scenario(pool)
    assert new.config == old.config == EngineConfig(64, 4096, sliding_window=4096)
    written = old.to_dict()
    assert written["sliding_window"] == 4096 and "sliding_window" not in written["pool"]
    assert parse_scenario(written) == old


def test_a_scenario_with_the_window_in_both_places_is_refused():
    data = _scenario(sliding_window=4096)
    data["pool"]["sliding_window"] = 4096
    with pytest.raises(ScenarioError, match="'sliding_window' twice"):
        parse_scenario(data)


def test_a_check_unit_carries_the_whole_record_and_reads_an_older_unit():
    options = CheckOptions(rounds=2, requests=1)
    config, back = from_unit_args({**unit_args(HYBRID, options), "combo": "x"})
    assert config == HYBRID and (back.rounds, back.requests) == (2, 1)
    older = {"page_size": 16, "chunk_size": 789, "swa_window": 4096, "combo": "x"}
    assert from_unit_args(older)[0] == EngineConfig(16, 789, sliding_window=4096)


@pytest.mark.parametrize("flag", ["--sliding-window", "--swa-window"])
def test_check_takes_the_window_under_its_name_and_its_former_one(flag):
    out = CliRunner().invoke(main, ["check", flag, "8", "--json"])
    assert out.exit_code == 2
    assert "--sliding-window 8 is smaller than one 64-token page" in out.output


def test_check_config_takes_the_record_from_a_scenario_and_refuses_a_clashing_flag(tmp_path):
    path = tmp_path / "node.json"
    path.write_text(json.dumps(_scenario(sliding_window=8)))
    assert load_scenario(path).config.sliding_window == 8
    clash = CliRunner().invoke(main, ["check", "--config", str(path), "--chunk-size", "64"])
    assert clash.exit_code == 2 and "--chunked-prefill-size, not both" in clash.output
    out = CliRunner().invoke(main, ["check", "--config", str(path), "--json"])
    assert out.exit_code == 2 and "--sliding-window 8 is smaller" in out.output


def test_an_older_check_document_states_its_window(tmp_path):
    from policykit.docsgen.results import load_results_file
    from policykit.docsgen.verdict_matrix import config_sentence

    doc = {"schema": "policykit.check/1", "verdicts": [], "config": {"swa_window": 512}}
    path = tmp_path / "check.json"
    path.write_text(json.dumps(doc))
    (check,) = load_results_file(path)
    assert "sliding window **512** tokens" in config_sentence(check)
