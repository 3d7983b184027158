"""The CPU server check (``.ci/vllm-serve``) without a server: its prompts, its server command,
how it reads a server's log and metrics, its verdicts; the tiny model's tokenizer; and, on vLLM
0.33.0's real scheduler (skipped without the ``vllm`` extra), the step log's barrier and lines
and the guard's shutdown line, parsed back as the check parses a server's log."""

from __future__ import annotations

import copy
import json
import logging
import random

import pytest

from policykit.harness import vllm_serve_check as check
from policykit.harness import vllm_serve_model as model
from policykit.harness import vllm_serve_verdicts as read


def _args(tmp_path, *extra):
    return check.parse(["--workdir", str(tmp_path), *extra])


def test_prompt_lengths_are_distinct_and_leave_room_for_the_output():
    lengths = check.prompt_lengths(16, 256, 16)
    assert len(set(lengths)) == 16 and lengths == sorted(lengths)
    assert lengths[0] == 33 and lengths[-1] == 256 - 16
    lone = check.lone_lengths(lengths)
    assert len(lone) == check.LONE and not set(lone) & set(lengths)
    with pytest.raises(ValueError, match="distinct prompt lengths"):
        check.prompt_lengths(300, 256, 16)


def test_bad_arguments_exit_2(tmp_path, capsys):
    for extra in (["--block-size", "16"], ["--requests", "0"], ["--requests", "400"]):
        with pytest.raises(SystemExit) as stopped:
            _args(tmp_path, *extra)
        assert stopped.value.code == 2
    assert "multiple of 32" in capsys.readouterr().err


def test_each_side_names_its_class_on_the_loopback_with_no_combo(tmp_path):
    args = _args(tmp_path)
    own, policy = (check.server_command(args, tmp_path / "m", side) for side in check.SIDES)
    # -P: a policykit/ folder in the working directory cannot shadow the install
    assert own[1:4] == ["-P", "-m", "vllm.entrypoints.openai.api_server"]  # not the console script
    assert own[own.index("--host") + 1] == "127.0.0.1"
    assert own[own.index("--scheduler-cls") + 1].endswith(".LoggedScheduler")
    assert policy[policy.index("--scheduler-cls") + 1].endswith(".LoggedPolicyScheduler")
    assert [a for a in own if not a.endswith("Scheduler")] == [
        a for a in policy if not a.endswith("Scheduler")
    ]
    env = check.server_env(args, {"POLICYKIT_COMBO": "queue=lpm", "POLICYKIT_CONFIG": "x"})
    assert "POLICYKIT_COMBO" not in env and "POLICYKIT_CONFIG" not in env
    assert env[read.REQUESTS_ENV] == "16"


LOG = """\
(EngineCore pid=1) INFO 12-04 18:53:39 [startup.py:89] policykit vLLM scheduler active with \
vllm/vllm/none/default/fcfs/vllm (vLLM's own decisions; EngineConfig(page_size=32))
(EngineCore pid=1) INFO 12-04 18:57:35 [vllm_serve_steplog.py:53] policykit serve-check \
arrived: [33, 46]
(EngineCore pid=1) INFO 12-04 18:57:35 [vllm_serve_steplog.py:67] policykit serve-check \
step: {"scheduled":[[33,33],[46,95]],"preempted":[]}
(EngineCore pid=1) INFO 12-04 18:57:35 [vllm_serve_steplog.py:67] policykit serve-check \
step: {"scheduled":[[33,1]],"preempted":[46]}
(EngineCore pid=1) INFO 12-04 19:02:12 [scheduler.py:136] policykit vLLM scheduler shutting \
down with vllm/vllm/none/default/fcfs/vllm: answered {"admission": 2, "chunking": 3}, \
fallbacks {}
"""

METRICS = """\
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 2.0
vllm:num_preemptions_created{engine="0",model_name="tiny"} 1.7e+09
"""


def test_the_log_gives_arrivals_steps_combo_and_guard():
    found = read.parse_log(LOG)
    assert found["arrivals"] == [33, 46]
    assert found["steps"] == [
        {"scheduled": [[33, 33], [46, 95]], "preempted": []},
        {"scheduled": [[33, 1]], "preempted": [46]},
    ]
    assert found["combo"] == read.VLLM_COMBO
    assert found["guard"] == {"answered": {"admission": 2, "chunking": 3}, "fallbacks": {}}
    assert read.parse_log("nothing here") == {
        "arrivals": None,
        "steps": [],
        "combo": None,
        "guard": None,
    }


def test_a_counter_is_read_under_its_total_name_and_summed_over_labels():
    assert read.metric(METRICS, read.PREEMPTIONS) == 2.0
    assert read.metric(METRICS, "vllm:num_requests_running") is None


def _runs():
    lengths = [33, 46]
    steps = read.parse_log(LOG)["steps"]
    burst = [{"prompt_tokens": n, "tokens": 16, "latency_s": 0.5} for n in lengths]
    run = {
        "burst": burst,
        "lone": [{"prompt_tokens": 34, "tokens": 16, "latency_s": 0.04}],
        "arrivals": lengths,
        "steps": steps,
        "preemptions": 1.0,
        "combo": None,
        "guard": None,
        "version": "0.32.0",
        "startup_s": 30.0,
    }
    policy = copy.deepcopy(run)
    policy["combo"] = read.VLLM_COMBO
    policy["guard"] = {
        "answered": {"admission": 2, "chunking": 3, "preemption": 1},
        "fallbacks": {},
    }
    return {"vllm": run, "policykit": policy}, lengths


def test_the_checks_hold_on_equal_runs_and_name_what_broke():
    runs, lengths = _runs()
    assert all(read.checks(runs, lengths, 16).values())
    broken = copy.deepcopy(runs)
    broken["policykit"]["steps"][1]["scheduled"] = [[33, 2]]
    broken["policykit"]["guard"]["fallbacks"] = {"chunking": 1}
    broken["vllm"]["arrivals"] = [46, 33]
    broken["vllm"]["lone"][0]["tokens"] = 15
    verdicts = read.checks(broken, lengths, 16)
    assert {name for name, held in verdicts.items() if not held} == {
        "all_completed",
        "arrived_in_order",
        "guard_answered_no_fallbacks",
        "same_steps",
    }
    assert read.first_difference(runs["vllm"]["steps"], broken["policykit"]["steps"]) == 1
    assert "the step logs first differ at step 1" in read.summary(broken, verdicts)
    failed = {"vllm": {"error": "the server did not become healthy"}, "policykit": runs["vllm"]}
    assert not any(read.checks(failed, lengths, 16).values())


def test_no_preemption_fails_the_check():
    runs, lengths = _runs()
    for run in runs.values():
        run["preemptions"] = 0.0
    assert not read.checks(runs, lengths, 16)["preempted"]


def test_the_tokenizer_gives_one_token_per_word(tmp_path):
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    directory = model.build(tmp_path / "model")
    config = json.loads((directory / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == model.VOCAB_SIZE
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory))
    assert len(tokenizer.get_vocab()) == model.VOCAB_SIZE
    for index, length in enumerate((33, 46, 240)):
        ids = tokenizer(model.prompt_text(index, length))["input_ids"]
        assert len(ids) == length and min(ids) >= len(model.SPECIALS)
    assert tokenizer.decode([2, 3]) == "w0 w1"
    first_blocks = {model.prompt_text(i, 32) for i in range(16)}
    assert len(first_blocks) == 16  # no two prompts share a cached block


# -- on vLLM 0.33.0's scheduler ------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_side(vllm_oracle):
    from policykit.conformance.vllm import compare, driver, engine
    from policykit.harness import vllm_serve_steplog

    return compare, driver, engine, vllm_serve_steplog


@pytest.fixture(autouse=True)
def _no_startup_proof(monkeypatch):
    monkeypatch.setenv("POLICYKIT_STARTUP_CHECK", "0")
    monkeypatch.delenv("POLICYKIT_COMBO", raising=False)
    monkeypatch.delenv("POLICYKIT_CONFIG", raising=False)


def _lines(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records)


def test_both_step_logs_agree_on_vllms_own_combo(vllm_side, caplog):
    """What the server check compares, on the conformance driver's random scenarios under vLLM's
    default settings, with no combo set (as the server check runs both servers)."""
    compare, driver, engine, steplog = vllm_side
    rng = random.Random(5)
    knobs = engine.SchedulerKnobs()  # its full-sequence reservation: no prefill-only preemption
    for index in range(30):
        sc, _ = compare.random_scenario(rng, index)
        logs = []
        for cls in (steplog.LoggedScheduler, steplog.LoggedPolicyScheduler):
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="policykit.vllm"):
                driver.drive(sc, knobs, max_rounds=compare.MAX_ROUNDS, scheduler_cls=cls)
            logs.append(read.parse_log(_lines(caplog)))
        own, policy = logs
        assert own["steps"] and own["steps"] == policy["steps"], sc.name
        assert own["combo"] is None and policy["combo"] == read.VLLM_COMBO


def test_the_first_step_waits_for_the_expected_requests(vllm_side, monkeypatch, caplog):
    _, driver, engine, steplog = vllm_side
    monkeypatch.setenv(read.REQUESTS_ENV, "2")
    scheduler = engine.build_scheduler(
        block_size=32,
        num_blocks=21,
        budget=128,
        max_model_len=256,
        max_num_seqs=4,
        knobs=engine.SchedulerKnobs(),
        scheduler_cls=steplog.LoggedPolicyScheduler,
    )
    hasher = driver._block_hasher(32)
    with caplog.at_level(logging.INFO, logger="policykit.vllm"):
        scheduler.add_request(driver._make_request("a", driver._prompt(0, 40), hasher, 1.0))
        assert not scheduler.has_requests()  # the engine core waits on its input queue
        scheduler.add_request(driver._make_request("b", driver._prompt(1, 50), hasher, 2.0))
        assert scheduler.has_requests()
        scheduler.schedule()
        scheduler.shutdown()
    found = read.parse_log(_lines(caplog))
    assert found["arrivals"] == [40, 50]
    assert found["steps"] == [{"scheduled": [[40, 40], [50, 50]], "preempted": []}]
    assert found["guard"] == {"answered": {"admission": 2, "chunking": 2}, "fallbacks": {}}
