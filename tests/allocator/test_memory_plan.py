"""plan-memory against the worked examples of docs/incidents.md (runtime memory, KV-pool
sizing), and its refusals."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from policykit.cli import main
from policykit.memory.activation_peak import activation_peak
from policykit.memory.model_shapes import PRESETS, load_model_shape
from policykit.memory.plan import (
    GIB,
    MIB,
    MemoryPlanError,
    default_chunked_prefill_size,
    plan_kv,
    reserved_memory,
)

LLAMA = PRESETS["llama3-8b"]


def run(*args: str):
    return CliRunner().invoke(main, ["plan-memory", *args])


def test_h100_chunked_8192_tp8_reserves_13_8_gb_before_graphs():
    r = reserved_memory(80, chunked_prefill_size=8192, tp=8)
    assert (r.constant, r.activation, r.parallel) == (512, 12288, 1024)
    assert r.before_graphs == 13824  # the write-up's "≈ 13.8 GB" (MB as SGLang counts them)
    assert round(r.before_graphs / 1000, 1) == 13.8
    plan = plan_kv(LLAMA, 80, tp=8, chunked_prefill_size=8192)
    assert plan.mem_fraction_static == round((80 * 1024 - 13824) / (80 * 1024), 3)


def test_floor_lifts_small_reserves_on_big_cards_only():
    big = reserved_memory(80, chunked_prefill_size=2048)
    assert big.total == 10 * 1024 and big.floor_top_up > 0
    assert reserved_memory(48, chunked_prefill_size=2048).floor_top_up == 0


def test_60_gb_weights_fail_at_0_70_with_the_engines_advice():
    result = run(
        "--gpu-mem-gib", "80", "--model", "llama3-8b", "--weights-gib", "60",
        "--pre-load-gib", "78", "--mem-fraction-static", "0.70",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "Not enough memory. Please try to increase --mem-fraction-static" in result.output
    assert "-5.4 GiB" in result.output
    assert "Traceback" not in result.output


def test_60_gb_weights_fit_at_0_85():
    plan = plan_kv(
        LLAMA, 80, chunked_prefill_size=8192, mem_fraction_static=0.85,
        pre_load_gib=78, weights_gib=60,
    )  # fmt: skip
    assert plan.post_load / GIB == pytest.approx(18)
    assert plan.dynamic / GIB == pytest.approx(11.7)
    assert plan.kv_bytes / GIB == pytest.approx(6.3)
    assert plan.kv_tokens == int(6.3 * GIB) // LLAMA.kv_cell_bytes()


def test_same_fraction_runs_on_a_96_gb_card():
    plan = plan_kv(LLAMA, 96, chunked_prefill_size=8192, mem_fraction_static=0.7, weights_gib=60)
    assert plan.kv_bytes / GIB == pytest.approx(7.2)


def test_8b_dense_8192_prefill_mlp_and_pruned_logits():
    peak = activation_peak(LLAMA, tokens=8192, requests=8)
    assert round(peak.mlp / GIB, 1) == 0.7
    assert peak.resident + peak.mlp < GIB  # "with hidden/residual still under 1 GiB"
    assert round(peak.logits_pruned_fp32 / MIB, 1) == 3.9
    assert peak.logits_all > 1000 * peak.logits_pruned_fp32  # three orders of magnitude
    assert peak.logits_chunked < peak.logits_all


def test_kv_cells_mha_and_mla():
    assert LLAMA.kv_cell_bytes() == 8 * (128 + 128) * 32 * 2
    assert LLAMA.kv_cell_bytes(tp=8) == 1 * 256 * 32 * 2
    assert LLAMA.kv_cell_bytes(tp=16) == LLAMA.kv_cell_bytes(tp=8)  # heads replicated
    v3 = PRESETS["deepseek-v3"]
    assert v3.kv_cell_bytes() == (512 + 64) * 61 * 2 == v3.kv_cell_bytes(tp=8)


def test_presets_match_published_parameter_counts():
    assert LLAMA.param_count() / 1e9 == pytest.approx(8.03, abs=0.01)
    assert PRESETS["deepseek-v2-lite"].param_count() / 1e9 == pytest.approx(15.7, abs=0.1)
    assert PRESETS["deepseek-v3"].param_count() / 1e9 == pytest.approx(671, abs=1)


@pytest.mark.parametrize(
    ("gib", "tokens"), [(16, 2048), (24, 4096), (80, 8192), (141, 8192), (192, 16384)]
)
def test_default_chunked_prefill_by_card(gib, tokens):
    assert default_chunked_prefill_size(gib) == tokens


def test_json_output_and_config_file(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
                "torch_dtype": "bfloat16",
            }
        )
    )  # fmt: skip
    assert load_model_shape(str(cfg)).kv_cell_bytes() == LLAMA.kv_cell_bytes()
    result = run("--gpu-mem-gib", "80", "--model", str(cfg), "--tp", "8", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["kv"]["reserved"]["before_graphs_mib"] == 13824
    assert data["chunked_prefill_size"] == 8192
    assert data["activation"]["mlp_bytes"] == 8192 * 3 * 14336 // 8 * 2


def test_text_output_names_every_term():
    result = run("--gpu-mem-gib", "80", "--model", "llama3-8b", "--tp", "8")
    assert result.exit_code == 0, result.output
    for term in ("activation: 1.5 x 8192 tokens", "before graphs", "KV tokens", "pruned"):
        assert term in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "neither a model preset"),
        (["--gpu-mem-gib", "0"], "must be positive"),
        (["--gpu-mem-gib", "-8"], "must be positive"),
        (["--mem-fraction-static", "1.0"], "strictly between 0 and 1"),
        (["--mem-fraction-static", "0"], "strictly between 0 and 1"),
        (["--tp", "0"], "at least 1"),
        (["--chunked-prefill-size", "0"], "-1 to disable"),
        (["--pre-load-gib", "90"], "at most the card"),
        (["--gpu-mem-gib", "inf"], "finite"),
        (["--requests", "0"], "at least 1"),
        (["--weights-gib", "-1"], "cannot be negative"),
    ],
)
def test_bad_input_is_one_paragraph_and_exit_2(args, message):
    base = {"--gpu-mem-gib": "80", "--model": "llama3-8b"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    result = run(*[x for kv in base.items() for x in kv])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        '{"hidden_size": 64}',
        '{"hidden_size": "x"}',
        '{"hidden_size": 64, "intermediate_size": 1, "num_hidden_layers": 1, '
        '"num_attention_heads": 0, "vocab_size": 5}',
    ],
)
def test_bad_config_files(tmp_path, content):
    cfg = tmp_path / "config.json"
    cfg.write_text(content)
    result = run("--gpu-mem-gib", "80", "--model", str(cfg))
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: The model config")


def test_measure_without_cuda_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    result = run("--gpu-mem-gib", "80", "--model", "llama3-8b", "--measure")
    assert result.exit_code == 2
    assert "--measure" in result.output and "CUDA" in result.output


def test_planner_errors_are_policykit_errors():
    with pytest.raises(MemoryPlanError, match="page size"):
        plan_kv(LLAMA, 80, chunked_prefill_size=8192, page_size=0)
