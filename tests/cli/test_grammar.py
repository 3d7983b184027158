"""One combo grammar: every combo string any command prints is accepted back by ``--combo``."""

from __future__ import annotations

import json
import re

import pytest

from policykit.docsgen.comparisons import registered_combos, short_label
from policykit.errors import ComboError
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry, format_combo, parse_combo

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
_NAMES = sorted({e.name for e in REGISTRY.entries()}, key=len, reverse=True)
#: a printed combo: three to six policy names (with an optional :arg) joined by '/'
_NAME = "(?:" + "|".join(map(re.escape, _NAMES)) + r")(?::\d+)?"
_PRINTED = re.compile(rf"(?<![\w/-])(?:{_NAME}/){{2,5}}{_NAME}(?![\w/-])")
TWO = ("sglang/sglang/checkpoint:256", "reserve-tail/sglang/checkpoint:256")


def printed_combos(text: str) -> set[str]:
    return set(_PRINTED.findall(text))


def strings_in(doc) -> set[str]:
    """Every string value anywhere in a JSON document."""
    if isinstance(doc, dict):
        return set().union(*(strings_in(v) for v in doc.values())) if doc else set()
    if isinstance(doc, list):
        return set().union(*(strings_in(v) for v in doc)) if doc else set()
    return {doc} if isinstance(doc, str) else set()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sglang/defer/page", ("sglang", "defer", "page", "default", "fcfs", "none")),
        ("sglang/defer/page/expandable", ("sglang", "defer", "page", "expandable",
                                          "fcfs", "none")),
        ("sglang/defer/page/default/lpm", ("sglang", "defer", "page", "default", "lpm", "none")),
        ("sglang/defer/page/default/fcfs-skip", ("sglang", "defer", "page", "default",
                                                 "fcfs-skip", "none")),
        ("sglang+sglang+checkpoint:256", ("sglang", "sglang", "checkpoint:256", "default",
                                          "fcfs", "none")),
        ("margin-tail:2/half-budget/checkpoint:256", ("margin-tail:2", "half-budget",
                                                      "checkpoint:256", "default", "fcfs", "none")),
        ("sglang · sglang · page · default", ("sglang", "sglang", "page", "default",
                                              "fcfs", "none")),
        (" reserve-tail / sglang / page ", ("reserve-tail", "sglang", "page", "default",
                                            "fcfs", "none")),
        ("vllm/vllm/none/default/fcfs/vllm", ("vllm", "vllm", "none", "default", "fcfs",
                                              "vllm")),
        ("vllm-no-reserve/vllm-threshold:64/none/default/fcfs/vllm",
         ("vllm-no-reserve", "vllm-threshold:64", "none", "default", "fcfs", "vllm")),
    ],
)  # fmt: skip
def test_every_printed_spelling_parses(text, expected):
    assert tuple(parse_combo(text).values()) == expected


@pytest.mark.parametrize("text", ["sglang/defer", "a/b/c/d/e/f/g", "sglang//page", "sglang"])
def test_malformed_short_forms_are_combo_errors(text):
    with pytest.raises(ComboError):
        parse_combo(text)


def test_format_then_parse_is_the_identity_on_every_registered_combo():
    for combo in REGISTRY.all_combos(kinds=("admission", "chunking", "alignment",
                                            "allocator-phase", "queue",
                                            "preemption")):  # fmt: skip
        assert REGISTRY.resolve(str(combo)).as_dict() == combo.as_dict()
        assert format_combo(parse_combo(str(combo))) == str(combo)


def test_site_labels_are_the_printed_form():
    for key in registered_combos(REGISTRY):
        label = short_label(key)
        assert format_combo(parse_combo(label)) == label
        assert REGISTRY.resolve(label).as_dict() == parse_combo(key)


def _accepted_back(cli, found: set[str]) -> None:
    assert found
    for text in sorted(found):
        res = cli("simulate", "seed-abc", "--json", "--combo", text)
        assert res.exit_code in (0, 1), (text, res.output)
        assert format_combo(json.loads(res.stdout)["combo"]) == format_combo(parse_combo(text))


def test_simulate_output_round_trips(cli):
    res = cli("simulate", "seed-incident-1keim", "--combo", "admission=sglang,chunking=defer")
    assert res.exit_code in (0, 1), res.output
    found = printed_combos(res.stdout)
    assert "sglang/defer/page" in found
    _accepted_back(cli, found)


@pytest.mark.slow
def test_check_output_round_trips(cli):
    args = [
        "check",
        "--combo",
        "reserve-tail/defer/page/default/fcfs-skip",
        "--combo",
        "no-evict+sglang+page+default+fcfs-skip",
    ]
    text, doc = cli(*args), cli(*args, "--json")
    assert text.exit_code == doc.exit_code == 0, text.output
    found = printed_combos(text.stdout) | printed_combos(
        " ".join(strings_in(json.loads(doc.stdout)))
    )
    assert {
        "reserve-tail/defer/page/default/fcfs-skip",
        "no-evict/sglang/page/default/fcfs-skip",
    } <= found
    _accepted_back(cli, found)


@pytest.mark.slow
def test_bench_output_round_trips(cli):
    fast = ["--workload", "seed-abc", "--device", "cpu", "--model", "tiny"]
    combos = ["--combo", TWO[0], "--combos", "admission=reserve-tail,alignment=checkpoint:256"]
    text, doc = cli("bench", *fast, *combos), cli("bench", *fast, *combos, "--json")
    assert text.exit_code == doc.exit_code == 0, text.output
    data = json.loads(doc.stdout)
    found = printed_combos(text.stdout) | printed_combos(" ".join(strings_in(data)))
    assert set(TWO) <= found
    _accepted_back(cli, found)


def test_sweep_output_round_trips(cli, tmp_path):
    out = tmp_path / "sweep.json"
    args = ["sweep", "--scenarios", "seed-abc", "--workers", "1", "--combos", ";".join(TWO)]
    text = cli(*args, "--out", str(out))
    assert text.exit_code == 0, text.output
    found = printed_combos(text.stdout) | printed_combos(
        " ".join(strings_in(json.loads(out.read_text())))
    )
    assert set(TWO) <= found
    _accepted_back(cli, found)


def test_no_command_prints_an_older_spelling(cli):
    """The legacy separators are accepted but never printed."""
    res = cli("check", "--combo", "reserve-tail/defer/page")
    assert " · " not in res.stdout and "+defer+" not in res.stdout
