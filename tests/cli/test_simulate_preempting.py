"""``policykit simulate`` with a combo that preempts: vLLM's kind of node, its own output."""

from __future__ import annotations

import json

TWO_LONG = {
    "name": "two-long",
    "page_size": 16,
    "chunked_prefill_size": 64,
    "pool": {"free_tokens": 160},
    "kv_release_rounds": 0,
    "requests": [{"id": "A", "prompt_tokens": 120}, {"id": "B", "prompt_tokens": 120}],
}


def test_a_preempting_combo_runs_on_the_preempting_node(cli, tmp_path):
    path = tmp_path / "two.json"
    path.write_text(json.dumps(TWO_LONG))
    res = cli(
        "simulate", str(path), "--json", "--combo", "vllm/vllm-threshold:32/none/default/fcfs/vllm"
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["schema"] == "policykit.simulate.preempting/1" and doc["created"]
    assert doc["preemptions"] == 1 and doc["unfinished"] == []
    assert doc["rounds"][2]["preempted"] == ["B"]
    text = cli("simulate", str(path), "--combo", "vllm/vllm-threshold:32/none/default/fcfs/vllm")
    assert "1 preemption(s)" in text.stdout


def test_a_request_that_never_completes_exits_3(cli, tmp_path):
    held = {**TWO_LONG, "chunked_prefill_size": 32, "kv_release_rounds": None}
    held["requests"] = [
        {"id": "B", "prompt_tokens": 120, "arrival_round": 1},
        {"id": "A", "prompt_tokens": 120, "arrival_round": 2},
    ]
    path = tmp_path / "held.json"
    path.write_text(json.dumps(held))
    res = cli("simulate", str(path), "--combo", "vllm-no-reserve/vllm/none/default/fcfs/vllm")
    assert res.exit_code == 3, res.output
    assert "Never completed: A" in res.stdout


def test_a_request_that_waits_past_the_bound_exits_5_on_the_preempting_node(cli, tmp_path):
    """B is preempted in round 3 and waits rounds 3 and 4: starved at a bound of 1, though
    everything completes; listed in the text and the JSON."""
    path = tmp_path / "two.json"
    path.write_text(json.dumps(TWO_LONG))
    combo = "vllm/vllm-threshold:32/none/default/fcfs/vllm"
    args = ("simulate", str(path), "--combo", combo, "--starvation-rounds", "1")
    res = cli(*args, "--json")
    assert res.exit_code == 5, res.output
    doc = json.loads(res.stdout)
    assert doc["unfinished"] == [] and doc["starvation_rounds"] == 1
    assert doc["starved"] == [{"id": "B", "waited_rounds": 2}]
    text = cli(*args)
    assert text.exit_code == 5
    assert "starved:   B waited 2 rounds" in text.stdout and "Starved (exit 5)" in text.stdout
    assert cli("simulate", str(path), "--combo", combo, "--starvation-rounds", "2").exit_code == 0


def test_a_scenario_field_the_node_has_no_meaning_for_is_bad_input(cli):
    res = cli("simulate", "seed-abc", "--combo", "vllm/vllm/none/default/fcfs/vllm")
    assert res.exit_code == 2 and "host tier" in res.output


def test_check_gives_a_preempting_combo_its_own_properties(cli):
    res = cli("check", "--combo", "vllm/vllm/none/default/fcfs/vllm", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    rows = {v["property"]: v for v in doc["verdicts"]}
    assert set(rows) == {"admitted-completes", "no-starvation"}
    assert {v["verdict"] for v in rows.values()} == {"proved"}
    # vLLM's own combo: both by induction, so no bounds
    assert {v["bound"] for v in rows.values()} == {"unbounded"}
    assert {v["bounds"] for v in rows.values()} == {None}
    # page alignment is outside the induction: proved to the preempting model's bounds
    res = cli("check", "--combo", "vllm/vllm/page/default/fcfs/vllm", "--json")
    assert res.exit_code == 0, res.output
    rows = {v["property"]: v for v in json.loads(res.stdout)["verdicts"]}
    assert rows["admitted-completes"]["bound"] == "K=3,N=2"
    assert rows["admitted-completes"]["bounds"]["node"] == "preempting"
