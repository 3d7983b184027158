"""``policykit simulate --workload``: what ``bench --workload`` replays, without the model.

The argument is looked up as ``bench`` looks it up (:func:`policykit.harness.lookup.find_workload`).
A timed production trace (bundled, Mooncake, Azure) is replayed through the roofline clock at
scheduler level, as ``bench`` replays it minus the model forward; a generated workload or a
policykit-trace file is laid out on a node without a model and run round by round, as
``simulate SCENARIO`` runs a scenario. Both run on SGLang's node (the kind that never
preempts); a scenario (a file or a bundled name) is simply ``simulate SCENARIO``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TYPE_CHECKING

from policykit.cli.common import echo_json, load_registry, warn_if_uncheckable
from policykit.errors import PolicykitError
from policykit.render import default_console, print_run
from policykit.scheduler import Scheduler

if TYPE_CHECKING:
    from policykit.harness.lookup import WorkloadRef

#: the clock of a trace replay when simulate gives none: bench's defaults
CLOCK_MODEL = "llama3-8b"
CLOCK_GPU = "H200"
#: a generated workload's pool when --pool-tokens is not given: bench's default
DEFAULT_POOL_TOKENS = 8192


def simulate_workload(
    ref: WorkloadRef,
    combos: tuple[str, ...],
    pool_tokens: int | None,
    max_rounds: int,
    starvation_rounds: int,
    as_json: bool,
) -> None:
    """Run the workload ``ref`` names under the combo and exit with simulate's codes."""
    from policykit.harness.lookup import WorkloadKind

    if ref.kind is WorkloadKind.TRACE:
        _trace(ref.arg, combos, pool_tokens, starvation_rounds, as_json)
    else:
        _rounds(ref, combos, pool_tokens, max_rounds, starvation_rounds, as_json)


def _trace(
    arg: str,
    combos: tuple[str, ...],
    pool_tokens: int | None,
    starvation_rounds: int,
    as_json: bool,
) -> None:
    from policykit.cli.bench_trace import refuse_preempting, trace_table
    from policykit.cli.simulate_outcome import code_of, print_starved
    from policykit.harness.presets import get_preset
    from policykit.harness.roofline import get_gpu
    from policykit.harness.trace_bench import replay_config, run_trace_bench
    from policykit.harness.trace_formats import resolve_trace

    trace = resolve_trace(arg)
    config, source = replay_config(
        get_preset(CLOCK_MODEL), get_gpu(CLOCK_GPU), pool_tokens=pool_tokens
    )
    config = dataclasses.replace(config, starvation_rounds=starvation_rounds)
    pm, registry = load_registry()
    combo = registry.resolve(None, *combos, config=config.engine)
    if combo.preempts:  # vLLM's node has no host tier (bench_trace.refuse_preempting)
        config = dataclasses.replace(config, host_tier="off")
    refuse_preempting([combo], arg, config.host_tier)
    warn_if_uncheckable(combo, config.engine, as_json=as_json)
    doc = run_trace_bench(trace, [combo], config, pm=pm, pool_source=source)
    (row,) = doc["combos"]
    if as_json:
        echo_json({**doc, "starvation_rounds": starvation_rounds}, "policykit.simulate.trace/1")
    else:
        console = default_console()
        console.print(trace_table(doc))
        starved = {s["id"]: s["waited_rounds"] for s in row["starved"]}
        for rid, waited in starved.items():
            console.print(f"starved:   {rid} waited {waited} rounds")
        print_starved(starved, starvation_rounds, console)
    stuck = row["never_completes"] is not None or row["starvation"] is not None
    crashed, faulted = row["crash"] is not None, bool(row["policy_faults"])
    sys.exit(code_of(crashed, faulted, stuck, starved=bool(row["starved"])))


def _rounds(
    ref: WorkloadRef,
    combos: tuple[str, ...],
    pool_tokens: int | None,
    max_rounds: int,
    starvation_rounds: int,
    as_json: bool,
) -> None:
    from policykit.cli.simulate_outcome import exit_code, print_faults, print_starved, run_to_end
    from policykit.harness.build import lay_out_workload
    from policykit.harness.lookup import WorkloadKind
    from policykit.harness.workloads import generate, load_trace

    pool = DEFAULT_POOL_TOKENS if pool_tokens is None else pool_tokens
    if ref.kind is WorkloadKind.TRACE_FILE:
        workload = load_trace(ref.arg, pool)
    else:
        workload = generate(ref.arg, pool)
    pm, registry = load_registry()
    combo = registry.resolve(None, *combos, config=workload.config)
    if combo.preempts:
        raise PolicykitError(
            f"The combo {combo} preempts, but simulate --workload runs a generated workload or a "
            "policykit-trace file on SGLang's node only; simulate a scenario file with it, or "
            f"bench it: policykit bench --workload {ref.arg} --combo {combo}."
        )
    warn_if_uncheckable(combo, workload.config, as_json=as_json)
    node = lay_out_workload(workload)
    sched = Scheduler(node, combo, pm=pm, starvation_rounds=starvation_rounds)
    result = run_to_end(sched, max_rounds, quiet=as_json)
    if as_json:
        doc = {"workload": workload.summary(), **result.to_dict()}
        echo_json({**doc, "starvation_rounds": starvation_rounds}, "policykit.simulate/1")
    else:
        console = default_console()
        print_run(result, title=f"{workload.name} — {combo}", console=console)
        print_faults(result, console)
        print_starved(result.starved, starvation_rounds, console)
    sys.exit(exit_code(result))
