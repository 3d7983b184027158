"""``policykit conformance sglang``: exit codes, ``--json``, and the ``--schedule-policy`` switch.

Skipped without the ``policykit[sglang]`` extra, like every test that drives upstream.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from policykit.cli import main

if importlib.util.find_spec("sglang") is None:
    pytest.skip("the policykit[sglang] extra is not installed", allow_module_level=True)

pytestmark = pytest.mark.usefixtures("upstream")

#: lpm: r3's cached prefix is evicted in round 1, so in round 2 every waiting request matches
#: nothing. SGLang's stable sort keeps round 1's order (r3 first); policykit's ``lpm`` keeps
#: arrival order among equals (documented in its docstring), so the two differ.
LPM_TIE = {
    "page_size": 64,
    "chunked_prefill_size": 2048,
    "pool": {"free_tokens": 768, "evictable_tokens": 4672},
    "kv_release_rounds": 1,
    "requests": [
        {"id": "r0", "prompt_tokens": 2361},
        {"id": "r1", "prompt_tokens": 5820},
        {
            "id": "r2",
            "prompt_tokens": 3058,
            "device_prefix_tokens": 1600,
            "host_prefix_tokens": 1410,
        },
        {"id": "r3", "prompt_tokens": 1616, "device_prefix_tokens": 1408},
        {"id": "r4", "prompt_tokens": 1363, "computed_tokens": 222, "chunked": True},
    ],
}


def _run(*args: str):
    return CliRunner().invoke(main, ["conformance", "sglang", *args])


def test_identical_bundled_scenario_exits_0_with_a_json_document():
    result = _run("seed-incident-1keim", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["schema"] == "policykit.conformance/1" and data["created"]
    assert data["schedule_policy"] == "fcfs" and data["combo"].endswith("queue=fcfs")
    assert (data["identical"], data["different"]) == (1, 0)


def test_a_difference_exits_1_and_names_the_round(tmp_path):
    path = tmp_path / "lpm-tie.json"
    path.write_text(json.dumps(LPM_TIE))
    assert _run(str(path)).exit_code == 0  # fcfs: identical
    result = _run(str(path), "--schedule-policy", "lpm")
    assert result.exit_code == 1, result.output
    assert "round 2 batch" in result.output and "queue=lpm" in result.output


def test_bad_input_is_one_paragraph_and_exit_2(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"page_size": 0}')
    result = _run(str(path))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert _run().exit_code == 2  # nothing to compare


#: hybrid SWA with a 2048-token host run, four windows long: SGLang's own HiCache derives one
#: window of it as swa_host_hit_length, as policykit does (docs/conformance.md)
LONG_SWA_HOST_RUN = {
    "page_size": 64,
    "chunked_prefill_size": 8192,
    "sliding_window": 128,
    "pool": {"free_tokens": 12800, "evictable_tokens": 0, "swa_free_tokens": 2600},
    "requests": [{"id": "r0", "prompt_tokens": 3000, "host_prefix_tokens": 2048}],
}


def test_hybrid_swa_host_prefixes_run_on_sglangs_own_hicache(tmp_path):
    path = tmp_path / "long-swa-host-run.json"
    path.write_text(json.dumps(LONG_SWA_HOST_RUN))
    result = _run(str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["coverage"]["hybrid_swa_host"] == 1
    # the flag of the stand-in's days is accepted and changes nothing
    assert _run(str(path), "--swa-hicache").exit_code == 0
