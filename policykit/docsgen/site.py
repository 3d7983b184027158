"""``policykit docs`` end to end: gather results, write the generated pages, build the site.

Results come from ``--results DIR``, or, without it, from running what produces them: the
``check`` command (see :data:`PRODUCERS`) and the harness (:func:`run_harness`). Nothing is
lost on the way:

* the pages are written into a staging folder next to the generated one and swapped in only
  when everything succeeded, the site likewise; a failed run leaves the previous pages and
  site as they were;
* one uncheckable plugin costs one row: if ``check --all`` fails as a whole, every combination
  is checked on its own and the ones that cannot be get a ``refused`` verdict;
* the results used are kept with the pages (``generated/results``), so ``--results`` can
  rebuild from them later without running anything.

The generated folder carries a marker file, and a folder without it is never replaced. Outside
a docs project (no ``mkdocs.yml`` here and no ``--config``) the site is built from the config
packaged with policykit (:data:`SKELETON`) into ``--out``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policykit.docsgen.check_each import check_each
from policykit.docsgen.cli_reference import CommandLine, write_cli_page
from policykit.docsgen.comparisons import write_comparisons
from policykit.docsgen.concepts import write_concept_tables
from policykit.docsgen.markdown import Links, Provenance
from policykit.docsgen.policies import write_policies_page
from policykit.docsgen.results import (
    Results,
    ResultsError,
    load_results_dir,
    load_results_file,
    now_utc,
)
from policykit.docsgen.views import write_plugin_reference
from policykit.errors import PolicykitError
from policykit.interpreter import python_argv
from policykit.progress import ProgressBar, run_relayed
from policykit.registry import PolicyRegistry

MARKER = ".policykit-generated"
SCHEMA = "policykit.docs/1"
#: the packaged docs project used outside a policykit checkout
SKELETON = Path(__file__).with_name("skeleton")
#: first line of a config written from the skeleton (one without it is never overwritten)
SKELETON_STAMP = "# written by `policykit docs`"
#: where the packaged project goes when ``--out`` is not given
DEFAULT_PROJECT = Path("policykit-docs")

#: what the harness runs for the comparison page: the tiny CPU model, three timed repeats, on
#: host-hit-heavy at a 4096-token pool (the same 81 rounds and the same crashes as at 8192, in
#: about 60% of the time: three repeats must not triple the docs build)
HARNESS_WORKLOAD = "host-hit-heavy"
HARNESS_MODEL = "tiny"
HARNESS_POOL_TOKENS = 4096
HARNESS_REPEATS = 3
#: how the docs' progress bars start
LABEL = "policykit docs"
#: the model the harness's schedules are priced for (predicted time on H100/H200/B200)
PREDICT_MODEL = "llama3-8b"
#: the production traces the comparison page leads with (``policykit docs --workloads``)
TRACE_WORKLOADS: tuple[str, ...] = ("mooncake-conversation",)
#: the declared slice the docs replay (the first N requests): every combination at every
#: sweep load has to fit the docs' 10-minute budget on a 2-core machine
TRACE_REQUESTS = 500
#: a pool the slice fills, so that the combinations' memory decisions matter (the plan-memory
#: pool of llama3-8b on an H200, 849,920 tokens, is never under pressure on 500 requests)
TRACE_POOL_TOKENS = 65_536
#: the load sweep: arrival rate x the trace's (the first is the table's load)
TRACE_LOADS: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
TRACE_GPU = "H200"


def _step(label: str, total: int, quiet: bool) -> ProgressBar:
    """One step of the docs: a bar on a terminal, then how long it took (nothing under
    ``--json``, in a log or in CI)."""
    return ProgressBar(label, total, summary=True, quiet=quiet)


class DocsError(PolicykitError):
    """The docs could not be generated or built (bad paths, a failing producer, mkdocs)."""


#: builds a results document itself when its producer command failed as a whole (the registry,
#: and whether the docs run quietly)
Fallback = Callable[[PolicyRegistry, bool], dict[str, Any]]


def _check_each_fallback(registry: PolicyRegistry, quiet: bool) -> dict[str, Any]:
    with _step(f"{LABEL}: checking each combination on its own", 0, quiet) as beat:

        def on_combo(i: int, n: int, combo) -> None:
            beat.total, beat.done = n, i
            beat.describe(str(combo))

        return check_each(registry, on_combo=on_combo)


@dataclass(frozen=True)
class Producer:
    """A command whose ``--json`` output the comparison pages read (schema: provisional)."""

    command: str
    args: tuple[str, ...]
    #: the JSON arrives on stdout (else the command writes the file named by ``{out}``)
    stdout: bool
    #: exit codes that still mean "results written" (a violation or a crash is a result)
    ok_codes: tuple[int, ...]
    #: what to do when the command fails as a whole (``None``: the docs fail)
    fallback: Fallback | None = None


PRODUCERS: tuple[Producer, ...] = (
    Producer(
        "check",
        ("check", "--all", "--json"),
        stdout=True,
        ok_codes=(0, 1, 3),  # a refusal exits 2 with its rows in the JSON: see _complete
        fallback=_check_each_fallback,
    ),
)


@dataclass
class DocsReport:
    out: Path
    pages: list[Path] = field(default_factory=list)
    results: list[tuple[str, str]] = field(default_factory=list)  #: (file, kind)
    ran: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  #: (command, reason)
    #: what went wrong but did not stop the docs (a producer's fallback, refused rows)
    notes: list[str] = field(default_factory=list)
    site: Path | None = None
    config: Path | None = None

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "out": str(self.out),
            "config": None if self.config is None else str(self.config),
            "pages": [str(p) for p in self.pages],
            "results": [{"file": f, "kind": k} for f, k in self.results],
            "ran": self.ran,
            "skipped": [{"command": c, "reason": r} for c, r in self.skipped],
            "notes": self.notes,
            "site": None if self.site is None else str(self.site),
        }


# --- where things go ----------------------------------------------------------------------------
def docs_dir_of(config: Path) -> Path:
    """The ``docs_dir`` a mkdocs config names (default ``docs``), as an absolute path."""
    from mkdocs.utils.yaml import yaml_load

    try:
        with config.open(encoding="utf-8") as fh:
            data = yaml_load(fh) or {}
    except OSError as exc:
        raise DocsError(f"Cannot read the mkdocs config {str(config)!r}: {exc.strerror}.") from None
    return (config.parent / data.get("docs_dir", "docs")).resolve()


def check_replaceable(out: Path) -> None:
    """Refuse to replace a non-empty folder that ``policykit docs`` did not write."""
    if out.exists() and not (out / MARKER).exists() and any(out.iterdir()):
        raise DocsError(
            f"The output folder {str(out)!r} is not empty and was not written by `policykit "
            "docs` (no marker file); choose an empty or generated folder."
        )


def unpack_skeleton(root: Path) -> Path:
    """Write the packaged docs project into ``root``; its ``mkdocs.yml``."""
    config = root / "mkdocs.yml"
    if config.exists() and not config.read_text(encoding="utf-8").startswith(SKELETON_STAMP):
        raise DocsError(
            f"{str(config)!r} exists and was not written by `policykit docs`; pass --config to "
            "build that project, or choose another --out."
        )
    try:
        (root / "docs" / "stylesheets").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(SKELETON / "mkdocs.yml", config)
        shutil.copyfile(SKELETON / "index.md", root / "docs" / "index.md")
        shutil.copyfile(SKELETON / "extra.css", root / "docs" / "stylesheets" / "extra.css")
    except OSError as exc:
        raise DocsError(f"Cannot write the docs project into {str(root)!r}: {exc}.") from None
    return config


def resolve_config(config: Path | None, out: Path | None, build: bool) -> tuple[Path, Path]:
    """(mkdocs config, generated-pages folder). ``config=None`` means ``./mkdocs.yml``, or the
    packaged project written into ``out`` when there is none here."""
    if config is None and not Path("mkdocs.yml").is_file():
        root = (out or DEFAULT_PROJECT).resolve()
        config = unpack_skeleton(root)
        return config, docs_dir_of(config) / "generated"
    config = (config or Path("mkdocs.yml")).resolve()
    if not config.is_file():
        raise DocsError(f"There is no mkdocs config at {str(config)!r}; pass --config.")
    expected = docs_dir_of(config) / "generated"
    generated = (out or expected).resolve()
    if build and generated != expected:
        raise DocsError(
            f"The site's pages include the generated ones from {str(expected)!r}; writing them to "
            f"{str(generated)!r} and building would show stale pages. Use --no-build with --out."
        )
    return config, generated


# --- results ------------------------------------------------------------------------------------
def _complete(proc: subprocess.CompletedProcess, producer: Producer) -> bool:
    """Whether a command that exited non-zero still printed its whole results document
    (``check`` exits 2 when it refused a combination, with the refused rows in the JSON)."""
    if not producer.stdout:
        return False
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return False
    return isinstance(doc, dict) and isinstance(doc.get("schema"), str) and "verdicts" in doc


def run_producers(
    folder: Path,
    report: DocsReport,
    cli: CommandLine,
    registry: PolicyRegistry | None = None,
    *,
    quiet: bool = False,
) -> list[Results]:
    """Run each registered producer command, keeping its JSON under ``folder``; its bar shows
    the command's own progress (:func:`~policykit.progress.run_relayed`: for ``check --all``,
    the combos checked), not one step."""
    commands = cli.names()
    folder.mkdir(parents=True, exist_ok=True)
    results: list[Results] = []
    for producer in PRODUCERS:
        if producer.command not in commands:
            report.skipped.append(
                (producer.command, f"`policykit {producer.command}` is not installed here")
            )
            continue
        target = folder / f"{producer.command}.json"
        args = [a.replace("{out}", str(target)) for a in producer.args]
        with _step(f"{LABEL}: policykit {' '.join(args)}", 0, quiet) as beat:
            proc = run_relayed([*cli.argv, *args], beat)
        failed = proc.returncode not in producer.ok_codes and not _complete(proc, producer)
        why = proc.stderr.strip()[-800:] or proc.stdout.strip()[-800:]
        if failed:
            if producer.fallback is None or registry is None:
                raise DocsError(
                    f"`policykit {' '.join(args)}` exited with code {proc.returncode}: {why}"
                )
            report.notes.append(
                f"`policykit {' '.join(args)}` failed (exit {proc.returncode}: {why}); its "
                "results were made one combination at a time instead, refusing any that could "
                "not be checked."
            )
            doc = producer.fallback(registry, quiet)
            target.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        elif producer.stdout:
            target.write_text(proc.stdout, encoding="utf-8")
        try:
            results.extend(load_results_file(target))
        except ResultsError as exc:
            raise DocsError(
                f"`policykit {producer.command}` wrote results docs cannot read: {exc}"
            ) from None
        report.ran.append(producer.command)
    return results


def run_harness(folder: Path, report: DocsReport, *, quiet: bool = False) -> list[Results]:
    """The CPU harness over every registered combination, :data:`HARNESS_REPEATS` times each,
    run in this process (the bench's ``policykit.bench/1`` document, written to
    ``folder/bench.json``). A combination that provably decides as another (``fcfs`` beside
    ``fcfs-skip``: :func:`~policykit.harness.trace_groups.skip_twins`) carries that one's runs,
    marked ``same_replay_as``, when the other rejected no request."""
    import torch

    from policykit.harness.runner import resolve_input
    from policykit.harness.trace_groups import SKIP_TWIN, skip_twins, twin_row
    from policykit.plugin_manager import make_plugin_manager
    from policykit.registry import PolicyRegistry as Registry

    folder.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model gains nothing from more (see `bench --cpu-threads`)
    try:
        pm = make_plugin_manager()
        bench = resolve_input(HARNESS_WORKLOAD, HARNESS_POOL_TOKENS)
        combos = list(Registry.from_plugins(pm).all_combos(bench.config))
        groups = skip_twins(combos)
        doc = _bench(bench, [leader for leader, _ in groups], pm, quiet)
        rows = {row["combo"]: row for row in doc["combos"]}
        alone = [f for lead, fs in groups for f in fs if _rejected(rows[str(lead)])]
        if alone:
            more = _bench(bench, alone, pm, quiet)
            rows.update((row["combo"], row) for row in more["combos"])
            doc["wall_seconds"] += more["wall_seconds"]
        for leader, followers in groups:
            for twin in followers:
                rows.setdefault(str(twin), twin_row(rows[str(leader)], leader, twin, SKIP_TWIN))
        doc["combos"] = [rows[str(c)] for c in combos]
    finally:
        torch.set_num_threads(threads)
    doc["executor"] = {"name": "policykit docs, inline"}
    target = folder / "bench.json"
    target.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    report.ran.append("bench")
    return load_results_file(target)


def _rejected(row: dict[str, Any]) -> bool:
    """Whether a harness run rejected a request (if it did not, nothing was skipped)."""
    return bool(row["outcomes"]["requests"]["rejected"])


def _bench(bench: Any, combos: list[Any], pm: Any, quiet: bool) -> dict[str, Any]:
    """:func:`~policykit.harness.runner.run_bench` of ``combos`` with a progress bar."""
    from policykit.harness.model import Decoder
    from policykit.harness.presets import get_preset
    from policykit.harness.runner import run_bench

    label = f"{LABEL}: bench {HARNESS_WORKLOAD}, {HARNESS_REPEATS} runs per combination"
    with _step(label, len(combos) * HARNESS_REPEATS, quiet) as beat:

        def start(combo) -> None:
            if beat.current:
                beat.advance()
            beat.describe(str(combo))

        doc = run_bench(
            bench,
            combos,
            Decoder(get_preset(HARNESS_MODEL), "cpu", seed=0),
            pm=pm,
            on_combo_start=start,
            repeats=HARNESS_REPEATS,
            predict_model=get_preset(PREDICT_MODEL),
        )
        beat.advance()
    return doc


def run_traces(
    folder: Path,
    report: DocsReport,
    workloads: tuple[str, ...] = TRACE_WORKLOADS,
    *,
    quiet: bool = False,
    **executor: Any,
) -> list[Results]:
    """Every combination through each production trace at every sweep load, one executor
    unit each; the first load's rows make the trace's table (``trace-NAME.json``), all of
    them the sweep (``sweep-NAME.json``)."""
    from policykit.docsgen.trace_sweep import run_sweep
    from policykit.harness.presets import get_preset
    from policykit.harness.roofline import get_gpu
    from policykit.harness.trace_bench import replay_config, trace_document
    from policykit.harness.trace_formats import resolve_trace
    from policykit.plugin_manager import make_plugin_manager
    from policykit.registry import PolicyRegistry as Registry

    folder.mkdir(parents=True, exist_ok=True)
    out: list[Results] = []
    for name in workloads:
        trace = resolve_trace(name).head(TRACE_REQUESTS)
        config, source = replay_config(
            get_preset(PREDICT_MODEL), get_gpu(TRACE_GPU), pool_tokens=TRACE_POOL_TOKENS
        )
        engine = config.engine
        combos = list(Registry.from_plugins(make_plugin_manager()).all_combos(engine))
        base = {
            "requests": TRACE_REQUESTS,
            "model": PREDICT_MODEL,
            "gpu": TRACE_GPU,
            "pool_tokens": TRACE_POOL_TOKENS,
        }
        sweep, rows = run_sweep(
            name,
            combos,
            TRACE_LOADS,
            base,
            label=f"{LABEL}: {name} load sweep",
            quiet=quiet,
            **executor,
        )
        headline = trace_document(
            trace, config, rows[0], source, sweep["created"], sweep["wall_seconds"]
        )
        headline["executor"] = sweep["executor"]
        for kind, doc in (("trace", headline), ("sweep", sweep)):
            target = folder / f"{kind}-{name}.json"
            target.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
            out.extend(load_results_file(target))
        report.ran.append(f"bench --workload {name} (first {TRACE_REQUESTS} requests, sweep)")
    return out


def keep_results(results_dir: Path, folder: Path) -> list[Results]:
    """Read ``--results DIR`` and copy its files next to the pages (they survive the swap)."""
    results = load_results_dir(results_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for path in sorted(results_dir.glob("*.json")):
        shutil.copyfile(path, folder / path.name)
    return results


# --- pages and site -----------------------------------------------------------------------------
def generate(
    registry: PolicyRegistry,
    out: Path,
    results: list[Results],
    report: DocsReport,
    cli: CommandLine,
    links: Links | None = None,
) -> None:
    """Write every generated page into ``out`` (already prepared)."""
    links = links or Links()
    here = Provenance(
        device="CPU",
        model=None,
        date=now_utc(),
        produced_by="`policykit docs` from the plugin registry of this environment",
        verb="Generated",
    )
    report.pages.append(write_policies_page(registry, out, here, links))
    report.pages.append(write_cli_page(out, cli))
    report.pages.extend(write_concept_tables(registry, out, cli))
    report.pages.extend(write_plugin_reference(out))
    report.pages.extend(write_comparisons(registry, results, out, links))


def build_site(config: Path, site: Path, *, quiet: bool = False) -> None:
    """``mkdocs build --strict``, run in the config's folder (snippet paths are relative to it)."""
    with _step(f"{LABEL}: mkdocs build --strict", 1, quiet) as beat:
        proc = subprocess.run(
            [
                *python_argv("-m"),
                "mkdocs",
                "build",
                "--strict",
                "-f",
                str(config),
                "-d",
                str(site),
            ],
            cwd=config.parent,
            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
            capture_output=True,
            text=True,
            check=False,
        )
        beat.advance()
    if proc.returncode != 0:
        raise DocsError(
            f"`mkdocs build --strict` failed (exit {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-1500:]}"
        )


def remove_leftovers(generated: Path) -> None:
    """Staging folders of an earlier run that was killed (they carry the marker file); a
    previous folder it had moved aside but not yet replaced goes back first."""
    backup = generated.with_name(f".{generated.name}.previous")
    if backup.is_dir() and not generated.exists():
        backup.rename(generated)
    for folder in generated.parent.glob(f".{generated.name}.*"):
        if folder.is_dir() and (folder / MARKER).exists():
            shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def swapped_in(staging: Path, target: Path) -> Iterator[None]:
    """Put ``staging`` where ``target`` is for the body; keep it if the body succeeds, else put
    the previous ``target`` back. The previous one is removed only at the very end."""
    backup = target.with_name(f".{target.name}.previous")
    if backup.exists():
        shutil.rmtree(backup)
    had = target.exists()
    if had:
        target.rename(backup)
    staging.rename(target)
    try:
        yield
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        if had:
            backup.rename(target)
        raise
    if had:
        shutil.rmtree(backup, ignore_errors=True)


def make_docs(
    registry: PolicyRegistry,
    *,
    cli: CommandLine,
    config: Path | None = None,
    out: Path | None = None,
    results_dir: Path | None = None,
    site: Path | None = None,
    build: bool = True,
    workloads: tuple[str, ...] = TRACE_WORKLOADS,
    executor: dict[str, Any] | None = None,
    quiet: bool = False,
) -> DocsReport:
    """Gather results, write the pages and build the site; ``quiet`` (``--json``): no bars."""
    config, generated = resolve_config(config, out, build)
    check_replaceable(generated)
    report = DocsReport(generated, config=config)
    generated.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(generated)
    # a dot-folder beside the target: mkdocs ignores it, and the swap is a rename
    staging = Path(tempfile.mkdtemp(prefix=f".{generated.name}.", dir=generated.parent))
    try:
        (staging / MARKER).write_text("written by `policykit docs`; replaced on every run\n")
        if results_dir is not None:
            results = keep_results(results_dir, staging / "results")
        else:
            folder = staging / "results"
            results = run_producers(folder, report, cli, registry, quiet=quiet)
            results += run_traces(folder, report, workloads, quiet=quiet, **(executor or {}))
            results += run_harness(folder, report, quiet=quiet)
        report.results = [
            (str(generated / "results" / Path(r.source).name), r.kind) for r in results
        ]
        with _step(f"{LABEL}: writing the generated pages", 1, quiet) as beat:
            generate(registry, staging, results, report, cli, Links(docs_dir_of(config)))
            beat.advance()
        report.pages = [generated / p.relative_to(staging) for p in report.pages]
        with swapped_in(staging, generated):
            if build:
                report.site = (site or config.parent / "site").resolve()
                report.site.parent.mkdir(parents=True, exist_ok=True)
                fresh = Path(
                    tempfile.mkdtemp(prefix=f".{report.site.name}.", dir=report.site.parent)
                )
                try:
                    build_site(config, fresh, quiet=quiet)
                except BaseException:
                    shutil.rmtree(fresh, ignore_errors=True)
                    raise
                with swapped_in(fresh, report.site):
                    pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return report
