"""Bad input gets one paragraph naming the problem and exit code 2, never a traceback."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main

GOOD = {
    "page_size": 64,
    "chunked_prefill_size": 4096,
    "pool": {"free_tokens": 12032, "evictable_tokens": 0},
    "kv_release_rounds": None,
    "requests": [{"id": "A", "prompt_tokens": 1088}],
}


def with_(**changes):
    data = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        target = data
        *parents, leaf = path.split("__")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is KeyError:
            del target[leaf]
        else:
            target[leaf] = value
    return json.dumps(data)


CASES = {
    "malformed JSON": ("{not json", "not valid JSON"),
    "missing field": (with_(page_size=KeyError), "missing the required field 'page_size'"),
    "negative length": (with_(requests__0__prompt_tokens=-5), "'prompt_tokens' must be at least 1"),
    "prefix longer than prompt": (
        with_(requests__0__host_prefix_tokens=2000),
        "must be shorter than the 1088-token prompt",
    ),
    "unknown field": (with_(requests__0__promt_tokens=3), "unknown field(s) 'promt_tokens'"),
    "string number": (with_(chunked_prefill_size="4096"), "must be an integer"),
    "duplicate ids": (
        json.dumps({**GOOD, "requests": [{"id": "A", "prompt_tokens": 5}] * 2}),
        "appear twice",
    ),
    "pool not paged": (with_(pool__free_tokens=100), "not a whole number of 64-token pages"),
    "NaN": ('{"page_size": NaN}', "not valid JSON"),
    "not an object": ("[1, 2]", "must be a JSON object"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_scenario(tmp_path, case):
    text, expected = CASES[case]
    path = tmp_path / "s.json"
    path.write_text(text)
    result = CliRunner().invoke(main, ["simulate", str(path)])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert "Traceback" not in result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1


@pytest.mark.parametrize(
    ("combo", "expected"),
    [
        ("alignment=checkpoint:100", "not a positive multiple of the page size 64"),
        ("admission=nope", "no admission policy named 'nope'"),
        ("alignment=checkpoint", "needs a parameter"),
        ("alignment=checkpoint:abc", "must be checkpoint interval"),
        ("admission", "not of the form KIND=POLICY"),
        ("colour=red", "kind 'colour', which does not exist"),
        ("admission=sglang:3", "takes no parameter"),
        ("sglang/defer", "has 2 part(s)"),
        ("sglang/defer/page/default/fcfs/none/x", "has 7 part(s)"),
        ("sglang/defer/page/default/fcfs/x", "no preemption policy named 'x'"),
        ("sglang/defer/page/default/x", "no queue policy named 'x'"),
        ("nope/sglang/page", "no admission policy named 'nope'"),
        ("sglang/sglang/checkpoint:100", "not a positive multiple of the page size 64"),
    ],
)
def test_bad_combo(combo, expected):
    result = CliRunner().invoke(main, ["simulate", "seed-abc", "--combo", combo])
    assert result.exit_code == 2, result.output
    assert expected in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["check", "--all", "--combo", "sglang/sglang/page"],
        ["check", "--combos", ";"],
        ["bench", "--workload", "seed-abc", "--out", "/no/such/folder/r.json"],
        ["sweep", "--scenarios", "seed-abc", "--combo", "sglang/sglang/page", "--combo",
         "admission=sglang,chunking=sglang,alignment=page"],
    ],
)  # fmt: skip
def test_bad_command_lines_are_one_paragraph(args):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1


def test_missing_scenario_file():
    result = CliRunner().invoke(main, ["simulate", "does-not-exist.json"])
    assert result.exit_code == 2
    assert "no scenario file 'does-not-exist.json'" in result.output


def test_cuda_without_cuda():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(main, ["simulate", "seed-abc", "--device", "cuda"])
    assert result.exit_code == 2 and "sees no CUDA device" in result.output
