"""The page generators, one by one, on the real registry and real scheduler runs."""

from __future__ import annotations

import dataclasses
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from policykit.cli import COMMANDS
from policykit.cli.docs import command_line
from policykit.docsgen import comparisons, concepts, labels, markdown, policies, results
from policykit.docsgen.cli_reference import cli_page
from policykit.docsgen.markdown import Provenance
from policykit.plugin_manager import make_plugin_manager
from policykit.policy import KINDS
from policykit.registry import PolicyRegistry

from .conftest import FIXTURES, REPO

PROV = Provenance("CPU", None, "2026-11-29", "a test")


def registry() -> PolicyRegistry:
    return PolicyRegistry.from_plugins(make_plugin_manager())


# --- markdown helpers ---------------------------------------------------------------------------
def test_table_cells_cannot_break_rows():
    text = markdown.table(("a", "b"), [("x|y", "two\nlines")])
    assert text.splitlines()[2] == r"| x\|y | two lines |"


def test_fence_outlasts_backticks_in_the_code():
    assert markdown.fence("a ```` b", "text").startswith("`````text\n")


# --- policy reference ---------------------------------------------------------------------------
def test_policy_reference_documents_every_registered_policy():
    reg = registry()
    page = policies.policies_page(reg, PROV)
    for kind in KINDS:
        assert f"\n## {kind}\n" in page
    for entry in reg.entries():
        assert f"{{ #{policies.anchor(entry.kind, entry.name)} }}" in page
        assert entry.doc in page  # the full docstring, not only its summary
        assert f"Source of `{entry.cls.__qualname__}`" in page
        assert policies.source_location(entry.cls) in page
    # relative to the package's parent: stable across checkouts and virtual environments
    assert re.search(r"`(policykit/)?plugins/admission\.py:\d+`", page)


def test_policy_reference_lists_an_installed_third_party_policy(example_plugin):
    page = policies.policies_page(registry(), PROV)
    assert "{ #admission-watermark }" in page
    assert "policykit-example-policy 0.1.0" in page
    assert "`policykit_example_policy/__init__.py:" in page
    assert "Reserve-tail admission that keeps a watermark" in page


# --- CLI reference ------------------------------------------------------------------------------
def test_cli_reference_has_every_command():
    page = cli_page(command_line())
    for name in COMMANDS:
        assert f"## `policykit {name}`" in page
        assert f"Usage: policykit {name} [OPTIONS]" in page


# --- concept tables from real runs --------------------------------------------------------------
@pytest.fixture(scope="module")
def concept_tables(tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("generated")
    concepts.write_concept_tables(registry(), out, command_line())
    return {p.stem: p.read_text() for p in (out / "concepts").glob("*.md")}


def test_concept_tables_reproduce_the_incident(concept_tables):
    keim = concept_tables["1keim-sglang"]
    assert "|  | 1keim | [86784, 89088) | 2304 | truncated | 73792 | 18303 | 18304 |" in keim
    assert "OOM in round 4 while placing 1keim" in keim
    assert "Try to allocate 2056 tokens." in keim
    # the literal terminal output of `policykit simulate`, with its exit code
    assert "$ policykit simulate seed-incident-1keim --combo admission=sglang," in keim
    assert keim.rstrip().endswith("$ echo $?\n    1\n    ```")
    assert "No OOM" in concept_tables["1keim-reserve-tail"]


def test_concept_tables_tell_abc_and_swa(concept_tables):
    assert "| 1 | A | [0, 1088) | 1088 | whole |" in concept_tables["abc-sglang-page"]
    assert "|  | B | [0, 3008) | 3008 | truncated |" in concept_tables["abc-sglang-page"]
    assert "OOM in round 4 while placing B" in concept_tables["abc-sglang-checkpoint"]
    assert "rejected NO_TOKEN" in concept_tables["abc-reserve-tail-checkpoint"]
    assert "sliding-window free after" not in concept_tables["abc-sglang-page"]


def test_concept_tables_tell_the_swa_resume_on_the_paged_sliding_window_pool(concept_tables):
    """Before the fix, handing a resume the whole sliding-window budget fits (round 3: the
    allocation takes the chunk's pages, which are there); the fallback to the chunk budget once
    the budget is spent runs the pool out of memory (round 4). The fix keeps a page in round 3,
    defers the request in round 4 and resumes it when the finished request's KV comes back."""
    pre_fix = concept_tables["swa-pre-fix"]
    assert "| free after | sliding-window free after |" in pre_fix
    assert "| 3 | R | [5120, 8192) | 3072 | resumed |" in pre_fix
    assert "| 4 | R | [8192, 12288) | 4096 | resumed |" in pre_fix
    assert pre_fix.count("**OOM**") == 1 and "|  | **OOM** |" in pre_fix  # the window's pool
    assert "OOM in round 4 while placing R" in pre_fix
    assert "Try to allocate 4096 tokens." in pre_fix
    assert "Available swa tokens: 0 (swa_available_size=0 + swa_evictable_size_=0)" in pre_fix
    for slug in ("swa-swa-reserve", "swa-sglang"):
        fixed = concept_tables[slug]
        assert "| 3 | R | [5120, 8128) | 3008 | resumed |" in fixed
        assert "| 4 | R | - | 0 | deferred |" in fixed
        assert "| 5 | R | [8128, 12224) | 4096 | resumed |" in fixed
        assert "No OOM" in fixed and "completed: B, R · pending: -" in fixed


def test_every_concept_table_is_included_by_a_page(concept_tables):
    pages = "".join(p.read_text() for p in (REPO / "docs" / "concepts").glob("*.md"))
    for slug in concept_tables:
        assert f'--8<-- "generated/concepts/{slug}.md"' in pages


# --- results adapters ---------------------------------------------------------------------------
def test_fixture_results_load_through_the_adapters():
    loaded = results.load_results_dir(FIXTURES / "results")
    check = next(r for r in loaded if isinstance(r, results.CheckResults))
    bench = next(r for r in loaded if isinstance(r, results.BenchResults))
    assert {v.verdict for v in check.verdicts} == {"proved", "violated", "unknown", "refused"}
    assert sum(v.unbounded for v in check.verdicts) == 3
    no_evict = next(r for r in bench.runs if "no-evict" in r.combo)
    assert (no_evict.completed, no_evict.tokens_per_s, no_evict.peak_pool_use) == (2, 9100, 0.61)
    assert bench.provenance.model == "tiny"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "is not JSON"),
        ("[1]", "must hold one JSON object"),
        ('{"kind": "lint"}', "cannot tell which command wrote it"),
        (
            '{"kind": "check", "results": [{"combo": "planner=x", "verdict": "proved"}]}',
            "names the kind 'planner', which does not exist",
        ),
        (
            '{"kind": "check", "results": [{"combo": {}, "verdict": "fine"}]}',
            "expected one of proved, violated, unknown",
        ),
        ('{"kind": "bench", "runs": []}', "needs a 'workload' name"),
        (
            '{"kind": "bench", "workload": "w", "runs": [{"combo": {}, "tokens_per_s": "fast"}]}',
            "'tokens_per_s' must be a number",
        ),
    ],
)
def test_bad_results_files_get_a_clear_error(tmp_path: Path, content: str, message: str):
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(results.ResultsError, match=re.escape(message)):
        results.load_results_file(path)


# --- comparison page ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("generated")
    comparisons.write_comparisons(registry(), results.load_results_dir(FIXTURES / "results"), out)
    return out / "comparisons"


def _section_rows(page: str, heading: str) -> list[str]:
    section = page.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| `")]


def test_verdict_matrix_is_admission_by_queue_by_chunking_with_one_cell_per_combination(
    comparison: Path,
):
    page = (comparison / "index.md").read_text()
    combos = comparisons.registered_combos(registry())
    rows = _section_rows(page, "Formal verdicts")
    pairs = {(p["admission"], p["queue"], p["chunking"]) for p in map(results.combo_parts, combos)}
    # + the fixture's watermark combination, which is not registered without the plugin
    assert len(rows) == len(pairs) + 1
    assert sum("(not registered here)" in r for r in rows) == 1
    assert sum(r.count('<span class="pk-cell">') for r in rows) == len(combos) + 1
    header = page.split("| admission | queue | chunking |", 1)[1].split("\n", 1)[0]
    assert header.count("`") == 2 * 4  # one column per alignment: none, page, ckpt, trunc
    # one mark per property in every cell, the verdict in its tooltip
    assert '<span class="pk-proved" title="no-oom: proved (unbounded)">✓</span>' in page
    assert '<span class="pk-bounded" title="admitted-completes: proved to K=8">◑</span>' in page
    assert '<span class="pk-unknown" title="no-oom: unknown">?</span>' in page
    assert 'title="no-oom: not checked">–</span>' in page


def test_verdict_summary_says_what_is_safe_under_which_configuration(comparison: Path):
    page = (comparison / "index.md").read_text()
    section = page.split("## Formal verdicts\n", 1)[1].split("\n## ", 1)[0]
    assert "page size **64** tokens" in section and "no sliding window" in section
    assert "**K=4** rounds with **N=3** requests" in section
    assert "**Safe for every property, unbounded** (1 of 6 checked): `reserve-tail` with " in (
        section
    )
    assert "`reserve-tail` with any chunking" not in section  # only one of its 12 was checked
    assert "`no-oom` is **violated** by 1: `sglang` with `sglang/checkpoint:256`" in section
    assert "**unknown** for 1: `sglang` with `defer/truncation:192`" in section


def test_refused_verdicts_are_shown_distinctly_with_their_reason(comparison: Path):
    page = (comparison / "index.md").read_text()
    assert "**Refused** `no-evict/defer/page`: no-evict's admit() multiplies by a float" in (page)
    row = next(
        r
        for r in _section_rows(page, "Formal verdicts")
        if r.startswith("| `no-evict` | `fcfs` | `defer`")
    )
    assert row.count('class="pk-refused"') == 2  # both properties of that one combination
    assert "1 refused" in page


def test_each_violation_links_to_its_rendered_trace(comparison: Path):
    page = (comparison / "index.md").read_text()
    checks = results.load_results_dir(FIXTURES / "results")[1]
    violated = [v for v in checks.verdicts if v.verdict == "violated"]
    assert len(violated) == 2
    for v in violated:
        link = f"traces/{comparisons.trace_slug(v)}.md"
        assert f"]({link})" in page
        trace = (comparison / link).read_text()
        assert "## Replayed by the scheduler" in trace
        assert "OOM in round 4" in trace  # the exported scenario really crashes
        assert json.loads(trace.split("```json\n", 1)[1].split("\n```", 1)[0]) == v.scenario


def test_trace_pages_say_what_broke_and_never_end_in_success(comparison: Path):
    checks = results.load_results_dir(FIXTURES / "results")[1]
    pages = {
        v.property: (comparison / f"traces/{comparisons.trace_slug(v)}.md").read_text()
        for v in checks.verdicts
        if v.verdict == "violated"
    }
    # the counterexample's own failure description, and its failing round from the trace
    told = pages["admitted-completes"]
    assert '!!! failure "Property broken: admitted-completes (round 4)"' in told
    assert "Round 4: admitted request B can never complete. request B was admitted" in told
    # no description: the property and the round the replay crashed in
    plain = pages["no-oom"]
    assert '!!! failure "Property broken: no-oom (round 4)"' in plain
    assert "no-oom is violated in round 4 under sglang/sglang/checkpoint:256" in plain
    for page in pages.values():
        assert "!!! success" not in page
        assert "| **✗ 4** |" in page  # the failing round is marked in the replayed table


def test_harness_tables_and_plots(comparison: Path):
    page = (comparison / "index.md").read_text()
    assert "### Workload `host-hit-heavy`" in page
    assert "Measured on **cpu**, model preset `tiny`, 2026-11-29T12:30:00Z" in page
    assert "**✗ crashed in round 9**" in page and "15,200" in page and "41.0" in page
    for name in (
        "bench-host-hit-heavy-throughput.svg",
        "bench-host-hit-heavy-ttft.svg",
        "bench-host-hit-heavy-pool.svg",
        "replay-seed-abc-pool.svg",
    ):
        assert f"](plots/{name})" in page
        root = ET.parse(comparison / "plots" / name).getroot()
        assert root.tag.endswith("svg")


def test_replay_table_covers_every_combination_and_scenario(comparison: Path):
    page = (comparison / "index.md").read_text()
    rows = _section_rows(page, "Scenario replays")
    swa_only = labels.sliding_window_only(registry())
    assert len(rows) == len(comparisons.registered_combos(registry())) + len(swa_only) > 108
    sglang_ckpt = next(r for r in rows if r.startswith("| `sglang` | `sglang` | `checkpoint:256`"))
    assert sglang_ckpt.count("OOM in round 4") == 2  # seed-abc and the 1keim incident
    # the hybrid-SWA column is not "2/2 completed" on every row: the pre-fix chunking OOMs
    pre_fix = [r for r in rows if "`sglang-pre-swa-fix`" in r]
    assert len(pre_fix) == len(swa_only)
    assert all("**✗ OOM in round 4**" in r for r in pre_fix if "| `none` |" in r)
    # ... and the fixed chunkings complete both of its requests
    cells = [[c.strip() for c in r.strip("| ").split(" | ")] for r in rows]
    fixed = [c[-1] for c in cells if c[1] in ("`swa-reserve`", "`sglang`") and c[2] == "`none`"]
    assert fixed and set(fixed) == {"2/2 completed in 11 rounds"}
    assert all(r.count("not supported here") == 2 for r in pre_fix)  # no window in the seeds


def test_a_replay_outcome_names_every_request_that_did_not_complete():
    """ "2/3 completed" must not hide that the third request failed."""
    from policykit.docsgen.replay import Replay, scenario_from
    from policykit.scheduler import RunResult

    combo = registry().resolve("admission=reserve-tail")
    result = RunResult(combo, completed=["A", "B"], failed={"C": "a policy raised"})
    run = Replay(scenario_from("seed-abc"), result, 12032)
    assert run.outcome == "2/3 completed, 1 failed in 0 rounds"
    assert run.cell == "**✗ 2/3 completed, 1 failed in 0 rounds**"
    fine = Replay(run.scenario, RunResult(combo, completed=["A", "B", "C"]), 12032)
    assert fine.cell == "3/3 completed in 0 rounds"


def test_plots_are_reproducible(tmp_path: Path):
    a = comparisons.plots.bar_chart(tmp_path / "a.svg", ["x"], [1.0], title="t", xlabel="x")
    b = comparisons.plots.bar_chart(tmp_path / "b.svg", ["x"], [1.0], title="t", xlabel="x")
    assert a.path.read_bytes() == b.path.read_bytes()


def test_adapters_read_the_shapes_the_producers_are_converging_on(tmp_path: Path):
    """The spec and harness work in progress write nested objects (``device: {type, name}``,
    ``requests: {completed}``, ``ttft_s: {p50}``, the checker's short combo and ``K=..`` bounds,
    a counterexample object); the adapters read those as well as the documented flat shape."""
    check = {
        "schema": "policykit.check/1",
        "started": "2026-11-29T12:00:00+00:00",
        "verdicts": [
            {
                "combo": "sglang+sglang+checkpoint:256",
                "property": "no-oom",
                "verdict": "violated",
                "bound": "round 3",
                "seconds": 0.4,
                "note": "",
                "counterexample": {
                    "scenario": {"page_size": 64},
                    "rounds": [{"round": 1, "entries": [{"id": "B"}, {"id": "C"}], "oom": None}],
                },
            },
            {
                "combo": "reserve-tail+sglang+page",
                "property": "progress",
                "verdict": "proved",
                "bound": "K=4,N=3",
                "seconds": 1.0,
                "note": "bounded only",
            },
        ],
    }
    bench = {
        "schema": "policykit.bench/1",
        "started": "2026-11-29T12:30:00+00:00",
        "workload": {"name": "host-hit-heavy"},
        "model": {"preset": "tiny"},
        "device": {"type": "cuda", "name": "NVIDIA H200"},
        "combos": [
            {
                "combo": "admission=sglang,chunking=sglang,alignment=checkpoint:256",
                "policies": {"admission": "sglang", "alignment": "checkpoint:256"},
                "crash": {"round": 7, "kind": "full-pool"},
                "requests": {"completed": 5, "rejected": 0, "pending": 3},
                "prompt_tokens_per_s": 1000.0,
                "ttft_s": {"p50": 0.5, "p99": 0.9},
                "peak_kv_utilisation": 1.0,
                "planning_share": 0.02,
                "kv_utilisation": [{"round": 1, "used": 0.5}, {"round": 2, "used": 1.0}],
                "mfu": 0.51,
            }
        ],
    }
    (tmp_path / "c.json").write_text(json.dumps(check))
    (tmp_path / "b.json").write_text(json.dumps(bench))
    b, c = results.load_results_dir(tmp_path)
    violated, bounded = c.verdicts
    assert violated.combo == results.combo_key("admission=sglang,alignment=checkpoint:256")
    assert (violated.bound, violated.scenario) == (3, {"page_size": 64})
    assert violated.trace == ({"round": 1, "oom": None, "id": "B"}, {"id": "C"})
    assert (bounded.bound, bounded.unbounded, bounded.note) == (4, False, "bounded only")
    assert comparisons.verdict_cell(bounded) == (
        '<span class="pk-bounded" title="bounded only">◑ proved (to K=4)</span>'
    )
    run = b.runs[0]
    assert (run.completed, run.pending, run.crashed_at_round) == (5, 3, 7)
    assert (run.ttft_p50_s, run.ttft_p99_s, run.scheduler_share, run.mfu) == (0.5, 0.9, 0.02, 0.51)
    assert run.pool_use_by_round == (0.5, 1.0)
    assert b.workload == "host-hit-heavy"
    assert (b.provenance.device, b.provenance.model) == ("NVIDIA H200 (cuda)", "tiny")


def test_a_replay_without_oom_is_told_as_a_failure_or_a_warning_never_success():
    from policykit.docsgen.replay import failure_markdown, replay, scenario_from

    stuck = replay(scenario_from("seed-abc"), "admission=sglang,alignment=page", registry())
    assert stuck.result.oom is None and stuck.result.pending
    told = failure_markdown(stuck, "C is admitted but never completes")
    assert told.startswith('!!! failure "C is admitted but never completes"')
    fine = replay(
        scenario_from(str(concepts.HYBRID_SWA)), "admission=sglang,chunking=defer", registry()
    )
    assert fine.result.oom is None and not fine.result.pending
    assert failure_markdown(fine, "x").startswith(
        '!!! warning "The replay did not reproduce the failure"'
    )


def test_bounded_only_safety_states_its_bound():
    from policykit.docsgen.verdict_matrix import summary

    key = results.combo_key("admission=reserve-tail,alignment=page")
    verdicts = tuple(
        results.VerdictRow(key, prop, "proved", bound, 1.0, None, ())
        for prop, bound in (("no-oom", None), ("progress", 4))
    )
    check = results.CheckResults(
        Provenance("cpu", None, "d", "check"), verdicts, Path("c.json"), {"rounds": 4}
    )
    text = summary(check, [key], ["no-oom", "progress"])
    assert "**Safe for every property, unbounded** (0 of 1 checked): none." in text
    assert "**Safe for every property, but only up to K=4 rounds** (1):" in text


def test_a_counterexample_that_preempts_is_replayed_on_the_node_that_preempts(tmp_path: Path):
    """A violation of a combo that preempts, as ``policykit check`` writes it, gets its page
    replayed on the node that preempts (the checker's own replay): its steps with the
    preemption and the blocks, the failing step marked, the failure told, never "Not
    replayable here"."""
    from click.testing import CliRunner

    from policykit.cli import main
    from policykit.docsgen.traces import trace_page

    out = tmp_path / "check.json"
    combo = "vllm-no-reserve/vllm/none/default/fcfs/vllm"
    res = CliRunner().invoke(main, ["check", "--combo", combo, "--json", "--out", str(out)])
    assert res.exit_code == 1, res.output
    (check,) = results.parse_check(json.loads(out.read_text()), out)
    (v,) = [v for v in check.verdicts if v.property == "admitted-completes"]
    assert v.verdict == "violated" and v.request == "B"
    page = trace_page(v, registry(), PROV)
    assert "Not replayable here" not in page and "!!! success" not in page
    assert "| step | request | event | chunk [start, end) | tokens | blocks used | free |" in page
    assert re.search(r"\| \d+ \| B \| preempted \|", page)
    assert f"| **✗ {v.round}** |" in page
    assert "The replay ends in it: request B never completes (stalled)." in page
    # a scenario the node runs to the end is told as a warning, not as the failure
    roomy = {**v.scenario, "pool": {"free_tokens": 1 << 16, "evictable_tokens": 0}}
    page = trace_page(dataclasses.replace(v, scenario=roomy), registry(), PROV)
    assert '!!! warning "The replay did not reproduce the failure"' in page
    assert '!!! failure "Property broken: admitted-completes' in page  # the verdict's banner
