"""The comparison page's production-trace section, its results files and its load sweep.

The fixtures ``trace-mooncake-conversation.json`` and ``sweep-mooncake-conversation.json`` are
real runs: ``run_trace_bench`` and ``replay_unit`` on the first 40 requests of the bundled
Mooncake conversation trace, five combos, a 32,768-token pool, loads 1, 16 and 64.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.docsgen.comparisons import write_comparisons
from policykit.docsgen.results import (
    ResultsError,
    TraceBenchResults,
    TraceSweepResults,
    load_results_dir,
    load_results_file,
)
from policykit.docsgen.trace_section import sig
from policykit.docsgen.trace_sweep import run_sweep
from policykit.registry import registry_from

from .conftest import FIXTURES

RESULTS = FIXTURES / "results"


def test_trace_results_files_are_read_by_their_adapters() -> None:
    results = load_results_dir(RESULTS)
    bench = next(r for r in results if isinstance(r, TraceBenchResults))
    sweep = next(r for r in results if isinstance(r, TraceSweepResults))
    assert bench.trace["name"] == "mooncake-conversation"
    assert sum(g["size"] for g in bench.groups) == len(bench.rows) == 5
    assert sweep.points == (1.0, 16.0, 64.0)
    assert all(len(v) == 3 for v in sweep.combos.values())


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.pop("groups"), "groups"),
        (lambda d: d["combos"][0].pop("outcomes"), "outcomes"),
        (lambda d: d.__setitem__("trace", 3), "trace"),
    ],
)
def test_a_broken_trace_results_file_is_refused(tmp_path: Path, change, words: str) -> None:
    doc = json.loads((RESULTS / "trace-mooncake-conversation.json").read_text())
    change(doc)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=words):
        load_results_file(path)


def test_the_comparison_page_leads_with_the_trace(tmp_path: Path) -> None:
    write_comparisons(registry_from(), load_results_dir(RESULTS), tmp_path)
    page = (tmp_path / "comparisons" / "index.md").read_text()
    trace = page.index("## Production trace: mooncake-conversation")
    assert trace < page.index("## Formal verdicts") < page.index("## Scenario replays")
    assert "3 combos behave identically" in page and "2 combos behave identically" in page
    assert "fall into **2 behaviours**" in page
    assert "With alignment `checkpoint`" in page  # why the two rows differ
    assert "of its 512-token blocks repeat an earlier block" in page
    for plot in (
        "trace-mooncake-conversation-load-sweep.svg",
        "trace-mooncake-conversation-ttft-by-load.svg",
    ):
        assert (tmp_path / "comparisons" / "plots" / plot).is_file()
        assert f"plots/{plot}" in page
    # predicted seconds with three significant digits, never more
    section = page[trace : page.index("## Formal verdicts")]
    for cell in re.findall(r"\| (\d+\.\d+)/(\d+\.\d+) \|", section):
        for number in cell:
            assert len(number.replace(".", "").lstrip("0")) <= 3, number


def test_three_significant_digits() -> None:
    assert [sig(x) for x in (2.6024991, 123456.7, 0.000123456, None)] == [
        "2.6",
        "1.23e+05",
        "0.000123",
        "-",
    ]


def test_the_sweep_runs_through_the_executor() -> None:
    registry = registry_from()
    combos = ["sglang/sglang/page", "reserve-tail/sglang/checkpoint:256", "sglang/sglang/page"]
    combos[2] += "/default/fcfs-skip"  # fcfs's skip twin: one replay for both
    doc, rows = run_sweep(
        "mooncake-conversation",
        [registry.resolve(c) for c in combos],
        (1.0, 4.0),
        {"requests": 8, "pool_tokens": 32768},
        executor="local",
        workers=1,
    )
    assert doc["schema"] == "policykit.trace-sweep/1" and doc["failed"] == []
    assert doc["executor"]["name"] == "local"
    assert [len(r) for r in rows] == [3, 3]
    assert [r.get("same_replay_as", {}).get("combo") for r in rows[0]] == [
        "sglang/sglang/page/default/fcfs-skip",
        None,
        None,
    ]
    assert doc["combos"]["sglang/sglang/page"] == doc["combos"][combos[2]]
    for points in doc["combos"].values():
        assert [p["verdict"] for p in points] == ["ok", "ok"]
        assert points[1]["ttft_p99_s"] >= points[0]["ttft_p99_s"]


def test_docs_refuses_a_workload_that_is_not_a_trace() -> None:
    result = CliRunner().invoke(main, ["docs", "--workloads", "long-prompts", "--no-build"])
    assert result.exit_code == 2
    assert "not a production trace" in result.output and "Traceback" not in result.output


def test_the_page_opens_with_a_conclusion_computed_from_the_results(tmp_path: Path) -> None:
    """A "for X, use Y" paragraph from the trace rows and the verdicts, before any table: the
    fixture's fastest sound row, against SGLang's default row, and how many combos carry
    proofs."""
    results = load_results_dir(RESULTS)
    write_comparisons(registry_from(), results, tmp_path)
    page = (tmp_path / "comparisons" / "index.md").read_text()
    opening = page[page.index("# Comparisons") : page.index("## Production trace")]
    assert opening.count("**In short**") == 1
    bench = next(r for r in results if isinstance(r, TraceBenchResults))
    best = min(bench.rows, key=lambda r: r["predicted"]["ttft_s"]["p99"])
    assert f"for the lowest TTFT p99 on mooncake-conversation, use `{best['combo']}`" in opening
    assert f"{sig(best['predicted']['ttft_s']['p99'])} s" in opening
    assert "whose every property is proved" in opening


def test_a_folded_row_names_the_combos_it_folds(tmp_path: Path) -> None:
    write_comparisons(registry_from(), load_results_dir(RESULTS), tmp_path)
    page = (tmp_path / "comparisons" / "index.md").read_text()
    section = page[page.index("## Production trace") : page.index("## Formal verdicts")]
    row = next(line for line in section.splitlines() if line.startswith("| sglang/<wbr>sglang"))
    assert "+2 alike</summary>" in row
    assert "no-evict/<wbr>sglang/<wbr>page, reserve-tail/<wbr>defer/<wbr>page</details>" in row


def test_rows_with_fairness_get_the_who_waited_table(tmp_path: Path) -> None:
    """A trace run of this version carries a ``fairness`` block per row: the section shows
    TTFT p99 and max by prompt size, the longest wait and preemptions for each behaviour."""
    doc = json.loads((RESULTS / "trace-mooncake-conversation.json").read_text())
    for row in doc["combos"]:
        classes = {
            name: {"requests": 1, "completed": 1, "ttft_s": {"p50": 1.0, "p99": 2.0, "max": 3.0}}
            for name in ("<1k", "1k-8k", ">8k")
        }
        row["fairness"] = {
            "size_classes": classes,
            "max_wait": {"seconds": 4.5, "rounds": 9, "request": "r1"},
            "preemptions": 7,
            "preempted_requests": 3,
            "max_preemptions_of_one_request": 2,
            "recomputed_after_preemption_tokens": 1234,
        }
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "trace.json").write_text(json.dumps(doc))
    write_comparisons(registry_from(), load_results_dir(folder), tmp_path)
    page = (tmp_path / "comparisons" / "index.md").read_text()
    assert "Who waited" in page
    assert "| 2 / 2 / 2 | 3 / 3 / 3 | 4.5 | 7 / 1,234 |" in page
    assert "for the shortest maximum wait on mooncake-conversation" in page
