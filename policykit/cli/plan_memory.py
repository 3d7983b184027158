"""``policykit plan-memory``: the KV pool and runtime memory of a card, before starting a server.

Prints the figures a user otherwise learns from a startup or runtime OOM: pre/post-load memory,
weights, KV bytes and tokens, the reserve behind an automatic ``mem_fraction_static`` term by
term, the card's default ``chunked_prefill_size``, and the activation peak of one forward.
"""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from policykit.cli.common import echo_json, json_option
from policykit.memory.activation_peak import LOGPROB_CHUNK_ROWS, ActivationPeak, activation_peak
from policykit.memory.model_shapes import ModelShape, load_model_shape
from policykit.memory.plan import (
    DEFAULT_MAX_PREFILL_TOKENS,
    GIB,
    MIB,
    KVPlan,
    MemoryPlanError,
    ReservedMemory,
    default_chunked_prefill_size,
    plan_kv,
)


@click.command("plan-memory")
@click.option("--gpu-mem-gib", type=float, required=True, help="Memory of one card, GiB.")
@click.option("--model", "model_spec", required=True, help="A preset name or a config.json path.")
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline-parallel size.")
@click.option(
    "--chunked-prefill-size",
    type=int,
    default=None,
    help="Tokens per prefill forward; -1 disables chunking. Default: by card memory.",
)
@click.option(
    "--mem-fraction-static",
    type=float,
    default=None,
    help="Share of pre-load memory for weights + KV. Default: SGLang's heuristic.",
)
@click.option("--page-size", type=int, default=1, show_default=True, help="KV page, tokens.")
@click.option("--pre-load-gib", type=float, default=None, help="Measured free memory before load.")
@click.option("--weights-gib", type=float, default=None, help="Measured weight memory per rank.")
@click.option(
    "--requests", type=int, default=8, show_default=True, help="Requests in one prefill batch."
)
@click.option(
    "--cuda-graph-max-bs",
    type=int,
    default=0,
    show_default=True,
    help="Largest decode CUDA-graph batch (0: a prefill node without decode graphs).",
)
@click.option("--deepep", is_flag=True, help="Reserve DeepEP all-to-all buffers (2 GiB).")
@click.option("--measure", is_flag=True, help="Measure on the CUDA device instead of estimating.")
@json_option
def plan_memory(
    gpu_mem_gib: float,
    model_spec: str,
    tp: int,
    pp: int,
    chunked_prefill_size: int | None,
    mem_fraction_static: float | None,
    page_size: int,
    pre_load_gib: float | None,
    weights_gib: float | None,
    requests: int,
    cuda_graph_max_bs: int,
    deepep: bool,
    measure: bool,
    as_json: bool,
) -> None:
    """Size the KV pool and the runtime reserve of one card, the way SGLang would.

    Exit code 2 when the inputs are invalid or the KV pool would be empty.
    """
    model = load_model_shape(model_spec)
    if requests < 1:
        raise MemoryPlanError(f"--requests must be at least 1, got {requests}.")
    card_default = default_chunked_prefill_size(gpu_mem_gib) if gpu_mem_gib > 0 else 0
    chunk = card_default if chunked_prefill_size is None else chunked_prefill_size
    facade = None
    pre_source = "given"
    if measure:
        from policykit.memory.allocator import AllocatorUnavailable, torch_allocator
        from policykit.memory.measure import measure_pre_load

        facade = torch_allocator()
        if not facade.is_available():
            raise AllocatorUnavailable(
                "--measure measures free memory and the activation moments on a CUDA device, "
                "and this torch build sees none; drop --measure to estimate instead."
            )
        if pre_load_gib is None:
            pre_load_gib = measure_pre_load(facade) / GIB
            pre_source = "measured (mem_get_info after empty_cache)"
    plan = plan_kv(
        model,
        gpu_mem_gib,
        tp=tp,
        pp=pp,
        chunked_prefill_size=chunk,
        mem_fraction_static=mem_fraction_static,
        page_size=page_size,
        pre_load_gib=pre_load_gib,
        weights_gib=weights_gib,
        cuda_graph_max_bs=cuda_graph_max_bs,
        deepep=deepep,
        pre_load_source=pre_source,
    )
    tokens = chunk if chunk > 0 else DEFAULT_MAX_PREFILL_TOKENS
    peak = activation_peak(model, tokens, requests, tp)
    if facade is not None:
        from policykit.memory.measure import measure_activation_peak

        peak = measure_activation_peak(facade, model, peak, tp)
        facade.empty_cache()

    if as_json:
        echo_json(
            {
                "model": model.to_dict(),
                "tp": tp,
                "pp": pp,
                "default_chunked_prefill_size": card_default,
                "chunked_prefill_size": chunk,
                "measured": measure,
                "kv": plan.to_dict(),
                "activation": peak.to_dict(),
            }
        )
        return
    _print(model, plan, peak, card_default, chunk, measure)


def _gib(b: float) -> str:
    return f"{b / GIB:,.2f} GiB"


def _size(b: float) -> str:
    return _gib(b) if abs(b) >= GIB else f"{b / MIB:,.1f} MiB"


def _print(
    model: ModelShape,
    plan: KVPlan,
    peak: ActivationPeak,
    card_default: int,
    chunk: int,
    measured: bool,
) -> None:
    console = Console()
    console.print(_figures_table(model, plan, card_default, chunk))
    if plan.reserved is not None:
        console.print(_reserve_table(plan.reserved))
    console.print(_activation_table(peak, "measured" if measured else "estimated"))
    if chunk <= 0:
        console.print(
            "[yellow]Chunked prefill is off: the activation peak is no longer capped; one "
            f"forward may be longer than the {DEFAULT_MAX_PREFILL_TOKENS} tokens shown.[/]"
        )


def _figures_table(model: ModelShape, plan: KVPlan, card_default: int, chunk: int) -> Table:
    """Card to KV pool, one figure a row, with where each figure came from."""
    pre_note = " (an upper bound: CUDA context, NCCL, other processes)"
    rows: list[tuple[str, str, str]] = [
        ("card memory", _gib(plan.gpu_mem), ""),
        (
            "pre-load free",
            _gib(plan.pre_load),
            plan.pre_load_source + (pre_note if "card" in plan.pre_load_source else ""),
        ),
        (
            "weights per rank",
            _gib(plan.weights),
            f"{plan.weights_source}; {model.name}, {model.param_count() / 1e9:.2f}B params",
        ),
        ("post-load free", _gib(plan.post_load), "pre - weights"),
        ("mem_fraction_static", f"{plan.mem_fraction_static:.3f}", plan.fraction_source),
        ("dynamic part", _gib(plan.dynamic), "(1 - y) x pre: activations, workspaces, graphs"),
        ("KV pool", _gib(plan.kv_bytes), "post - (1 - y) x pre"),
        (
            "KV per token",
            f"{plan.kv_cell:,} B",
            "MLA latent + rope"
            if model.is_mla
            else "kv_heads x (head_dim + v_head_dim) x layers x dtype",
        ),
        ("KV tokens", f"{plan.kv_tokens:,}", f"page size {plan.page_size}"),
        ("chunked_prefill_size", str(chunk), f"card default {card_default}"),
    ]
    table = Table(title=f"Memory plan — {model.name}", title_justify="left", header_style="bold")
    for col in ("figure", "value", "how"):
        table.add_column(col)
    for row in rows:
        table.add_row(*row)
    return table


def _reserve_table(r: ReservedMemory) -> Table:
    """The heuristic's reserve, term by term, in the MiB SGLang computes it in."""
    terms = Table(title="Reserve behind mem_fraction_static (MiB)", title_justify="left")
    terms.add_column("term")
    terms.add_column("MiB", justify="right")
    for name, value in (
        ("constant (attention metadata)", r.constant),
        (f"activation: 1.5 x {r.activation_tokens} tokens", r.activation),
        ("parallel: tp x pp / 8 x 1024", r.parallel),
        ("= before graphs", r.before_graphs),
        ("CUDA graph: 2 x decode max batch", r.cuda_graph),
        ("top-up to the 10 GiB floor (cards > 60 GiB)", r.floor_top_up),
        ("DeepEP all-to-all", r.deepep_a2a),
        ("= total", r.total),
    ):
        terms.add_row(name, f"{value:,.0f}")
    return terms


def _activation_table(peak: ActivationPeak, how: str) -> Table:
    """The moments of one forward and the peak under each way of computing logits."""
    act = Table(
        title=f"Activation peak of one forward ({peak.tokens} tokens, {peak.requests} requests, "
        f"{how})",
        title_justify="left",
    )
    act.add_column("moment")
    act.add_column("bytes", justify="right")
    moments: list[tuple[str, int]] = [
        ("hidden + residual (across layers)", peak.resident),
        ("attention: q/k/v + output", peak.attention),
        ("dense MLP: gate_up + activated", peak.mlp),
        ("MoE: topk x (gate_up + activated)", peak.moe),
        ("logits, pruned to one row per request (dtype + FP32)", peak.logits_pruned),
        ("  of which FP32 rows", peak.logits_pruned_fp32),
        (f"logits, input logprobs in {LOGPROB_CHUNK_ROWS}-row chunks", peak.logits_chunked),
        ("logits, every position (input logprobs unchunked)", peak.logits_all),
        ("peak: sampling only", peak.peak(peak.logits_pruned)),
        ("peak: chunked input logprobs", peak.peak(peak.logits_chunked)),
        ("peak: unchunked input logprobs", peak.peak(peak.logits_all)),
    ]
    for name, value in moments:
        act.add_row(name, _size(value))
    return act
