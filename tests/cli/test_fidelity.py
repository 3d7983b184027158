"""No silent approximation: a combo that claims SGLang 0.5.23's behaviour says, in one line,
when the input holds something that claim has not been shown for (hybrid SWA in the checker,
whose model does not keep sliding-window KV as SGLang's radix tree does; the node that
``simulate`` and ``bench`` run does)."""

from __future__ import annotations

import json

import pytest

from policykit.fidelity import GAPS, Holds, approximation_lines, approximations

#: hybrid SWA with a host-tier prefix: the node models both (policykit.swa_cache), the checker's
#: model not SGLang's sliding-window storage
HOST_WITH_SWA = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {
        "free_tokens": 16384,
        "evictable_tokens": 0,
        "swa_free_tokens": 8192,
        "sliding_window": 4096,
    },
    "kv_release_rounds": 1,
    "requests": [{"id": "A", "prompt_tokens": 2048, "host_prefix_tokens": 1024}],
}
BOTH = Holds(sliding_window=True, host_tier=True, checker=True)


@pytest.mark.parametrize(
    ("combo", "holds", "expected"),
    [
        ({"admission": "sglang"}, BOTH, 1),
        ({"chunking": "sglang"}, BOTH, 1),
        ({"admission": "reserve-tail", "chunking": "defer"}, BOTH, 0),
        ({"admission": "sglang"}, Holds(sliding_window=True, host_tier=False, checker=True), 1),
        ({"admission": "sglang"}, Holds(sliding_window=False, host_tier=True, checker=True), 0),
        ({"admission": "sglang"}, Holds(sliding_window=True, host_tier=True), 0),
    ],
)
def test_only_a_claimed_behaviour_on_an_input_holding_the_gap_is_an_approximation(
    combo, holds, expected
):
    lines = approximations(combo, holds)
    assert len(lines) == expected
    assert all("hybrid SWA storage" in line and "SGLang 0.5.23" in line for line in lines)


def test_each_line_is_said_once_for_many_combos():
    combos = [{"admission": "sglang", "alignment": a} for a in ("none", "page")]
    assert len(approximation_lines(combos, BOTH)) == len(GAPS) == 1


def test_holds_of_a_scenario(tmp_path):
    from policykit.scenario import parse_scenario

    assert Holds.of_scenario(parse_scenario(HOST_WITH_SWA)) == Holds(True, True)
    plain = {**HOST_WITH_SWA, "pool": {"free_tokens": 16384, "evictable_tokens": 0}}
    assert Holds.of_scenario(parse_scenario(plain)) == Holds(False, True)


@pytest.fixture
def host_swa_file(tmp_path):
    path = tmp_path / "host-swa.json"
    path.write_text(json.dumps(HOST_WITH_SWA))
    return path


def test_simulate_models_sglangs_swa_storage(cli, host_swa_file):
    text = cli("simulate", str(host_swa_file), "--combo", "sglang/sglang/none")
    assert "approximation:" not in text.output
    doc = json.loads(cli("simulate", str(host_swa_file), "--json").stdout)
    assert doc["approximations"] == [] and doc["combo"]["admission"] == "reserve-tail"


@pytest.mark.slow
def test_check_says_so_with_a_sliding_window_only(cli):
    args = ["check", "--combo", "sglang/sglang/page", "--rounds", "1", "--requests", "1"]
    swa = json.loads(cli(*args, "--sliding-window", "4096", "--json").stdout)
    assert len(swa["approximations"]) == 1
    assert json.loads(cli(*args, "--json").stdout)["approximations"] == []


def test_bench_models_sglangs_swa_storage(cli, host_swa_file):
    out = cli(
        "bench", "--workload", str(host_swa_file), "--device", "cpu", "--combo",
        "sglang/sglang/none", "--json",
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.stdout)["approximations"] == []
