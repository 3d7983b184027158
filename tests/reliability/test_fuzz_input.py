"""Bad input everywhere: whatever the scenario file or the ``--combo`` string holds, it loads
or gives a :class:`PolicykitError` with a message, never another exception or a hang; the CLI
answers exit code 2 and one line, never a traceback."""

from __future__ import annotations

import json
import sys

from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from policykit.cli import main
from policykit.config import EngineConfig
from policykit.errors import ComboError, PolicykitError, ScenarioError
from policykit.plugin_manager import make_plugin_manager
from policykit.registry import PolicyRegistry, parse_combo
from policykit.scenario import build_node, load_scenario, parse_scenario
from policykit.scheduler import Scheduler

REGISTRY = PolicyRegistry.from_plugins(make_plugin_manager(entry_points=False))
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])

numbers = st.one_of(
    st.integers(-3, 300),
    st.integers(),
    st.sampled_from([0, 1, 64, 1 << 24, (1 << 24) + 1, 1 << 34, 10**30, -(10**30)]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
scalars = st.one_of(st.none(), numbers, st.text(max_size=12))
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
ids = st.one_of(
    st.text(min_size=0, max_size=6), st.integers(), st.sampled_from(["A", "é", "🙂", " ", "\x00"])
)


@st.composite
def near_scenarios(draw):
    """A scenario that is mostly right: the fields exist, their values are anything."""
    page = draw(st.sampled_from([1, 16, 64]) | numbers)
    requests = []
    for _ in range(draw(st.integers(0, 4))):
        req = {"id": draw(ids), "prompt_tokens": draw(st.integers(1, 500) | numbers)}
        for key in (
            "device_prefix_tokens",
            "device_prefix_pinned",
            "host_prefix_tokens",
            "arrival_round",
            "computed_tokens",
            "chunked",
        ):
            if draw(st.booleans()):
                req[key] = draw(st.integers(0, 300) | st.booleans() | json_values)
        requests.append(req)
    if requests and draw(st.booleans()):
        requests.append(dict(requests[0]))  # a duplicate id
    data = {
        "page_size": page,
        "chunked_prefill_size": draw(st.integers(1, 512) | numbers),
        "pool": {
            "free_tokens": draw(st.integers(0, 64).map(lambda n: n * 64) | numbers),
            "evictable_tokens": draw(st.just(0) | numbers),
        },
        "kv_release_rounds": draw(st.none() | st.integers(0, 3) | numbers),
        "requests": requests,
    }
    for _ in range(draw(st.integers(0, 2))):  # then break one thing anywhere
        key = draw(st.sampled_from([*data, "pool", "extra", "name", "combo"]))
        data[key] = draw(json_values)
    return data


def _loads_or_explains(data) -> None:
    try:
        scenario = parse_scenario(data)
    except ScenarioError as err:
        assert str(err) and len(str(err)) < 600, "an error must be one readable paragraph"
        return
    if sum(r.prompt_tokens for r in scenario.requests) > 20_000 or scenario.free_tokens > 1 << 16:
        return  # valid and large: loading it is the soak's business, not a fuzz test's
    try:
        node = build_node(scenario)
    except ScenarioError:
        return
    combo = REGISTRY.resolve(None, config=scenario.config)
    Scheduler(node, combo, history=False).run(max_rounds=50)


@FUZZ
@given(data=json_values)
def test_any_json_value_loads_or_gives_a_scenario_error(data):
    _loads_or_explains(data)


@FUZZ
@given(data=near_scenarios())
@example(
    data={
        "page_size": 64,
        "chunked_prefill_size": 64,
        "pool": {"free_tokens": 1 << 34},
        "requests": [],
    }
)
@example(
    data={
        "page_size": 1,
        "chunked_prefill_size": 64,
        "pool": {"free_tokens": 64},
        "requests": [{"id": "x", "prompt_tokens": 1 << 24}] * 3,
    }
)
@example(
    data={
        "page_size": 1,
        "chunked_prefill_size": 1,
        "pool": {"free_tokens": 4},
        "requests": [{"id": "🙂", "prompt_tokens": 3}, {"id": "🙂", "prompt_tokens": 3}],
    }
)
@example(
    data={
        "page_size": 1,
        "chunked_prefill_size": 1,
        "pool": {"free_tokens": 4},
        "name": ["not", "text"],
        "requests": [],
    }
)
def test_near_valid_scenarios_load_run_or_give_a_scenario_error(data):
    _loads_or_explains(data)


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
@example(raw=b"\xef\xbb\xbf{}")  # a UTF-8 byte-order mark
@example(raw=b"[" * 100_000 + b"]" * 100_000)  # deeper than the parser's recursion
@example(raw=b'{"page_size": 1' + b"0" * 5000 + b"}")  # more digits than int() allows
@example(raw=b'{"page_size": 1e999}')  # a float that overflows to inf
@example(raw=b"\xff\xfe\x00")  # not UTF-8
def test_any_file_content_loads_or_gives_a_scenario_error(tmp_path_factory, raw):
    path = tmp_path_factory.mktemp("fuzz") / "s.json"
    path.write_bytes(raw)
    try:
        load_scenario(path)
    except ScenarioError as err:
        assert str(err)


def test_many_duplicate_ids_are_reported_without_quadratic_time():
    requests = [{"id": f"r{i % 50_000}", "prompt_tokens": 1} for i in range(100_000)]
    data = {
        "page_size": 1,
        "chunked_prefill_size": 1,
        "pool": {"free_tokens": 1},
        "requests": requests,
    }
    try:
        parse_scenario(data)
    except ScenarioError as err:
        assert "appear twice" in str(err) and str(err).count("'r") == 5


# --- the combo parser --------------------------------------------------------------------------
combo_atoms = st.sampled_from(
    [
        "admission",
        "chunking",
        "alignment",
        "allocator-phase",
        "colour",
        "",
        " ",
        "=",
        ",",
        ":",
        "sglang",
        "reserve-tail",
        "no-evict",
        "defer",
        "swa-reserve",
        "page",
        "checkpoint",
        "truncation",
        "default",
        "256",
        "-1",
        "0",
        "1" + "0" * 5000,
        "٣",
        "🙂",
        "\x00",
        "1e3",
    ]
)
combo_texts = st.text(max_size=60) | st.lists(combo_atoms, max_size=12).map("".join)


@FUZZ
@given(text=combo_texts, page=st.sampled_from([1, 16, 64]), swa=st.booleans())
@example(text="alignment=checkpoint:0", page=64, swa=False)
@example(text="alignment=truncation:" + "9" * 5000, page=64, swa=False)
@example(text="admission=sglang,admission=sglang", page=64, swa=False)
def test_any_combo_text_resolves_or_gives_a_combo_error(text, page, swa):
    try:
        parse_combo(text)
    except ComboError as err:
        assert str(err)
    try:
        REGISTRY.resolve(
            text, config=EngineConfig(page, 4096, sliding_window=4096 if swa else None)
        )
    except ComboError as err:
        assert str(err) and len(str(err)) < 5000


@FUZZ
@given(
    mapping=st.dictionaries(
        st.text(max_size=10) | combo_atoms, st.text(max_size=10) | combo_atoms, max_size=4
    )
)
def test_any_combo_mapping_resolves_or_gives_a_combo_error(mapping):
    """Scenario files carry a combo as a JSON object."""
    try:
        REGISTRY.resolve(mapping, config=EngineConfig(64, 4096))
    except ComboError as err:
        assert str(err)


# --- the command line --------------------------------------------------------------------------
def _assert_clean_exit(result) -> None:
    """Exit 0 (completed), 1 (OOM), 2 (bad input) or 3 (an admitted request can never
    complete); bad input under ``--json`` is one JSON error document on stderr."""
    assert result.exit_code in (0, 1, 2, 3), result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code == 2:
        error = json.loads(result.stderr)
        assert error["schema"] == "policykit.error/1" and error["exit_code"] == 2
        assert error["error"] and "\n" not in error["error"]


@settings(FUZZ, max_examples=min(settings.default.max_examples, 60))
@given(data=near_scenarios())
def test_simulate_on_any_scenario_exits_cleanly(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("cli") / "s.json"
    path.write_text(json.dumps(data))
    try:
        big = parse_scenario(data).free_tokens > 1 << 16
    except PolicykitError:
        big = False
    if big:
        return
    result = CliRunner().invoke(main, ["simulate", str(path), "--max-rounds", "30", "--json"])
    _assert_clean_exit(result)
    if result.exit_code in (0, 1, 3):
        json.loads(result.stdout)


@settings(FUZZ, max_examples=min(settings.default.max_examples, 60))
@given(text=combo_texts)
def test_simulate_with_any_combo_exits_cleanly(text):
    if text.startswith("-"):
        text = " " + text  # click would read it as an option
    result = CliRunner().invoke(main, ["simulate", "seed-abc", "--combo", text, "--json"])
    _assert_clean_exit(result)


def test_the_recursion_limit_is_left_as_it_was():
    assert sys.getrecursionlimit() >= 1000
