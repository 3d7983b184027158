"""Bad input in a JSONL trace (the harness's workload loader): it loads or says why."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from policykit.errors import PolicykitError
from policykit.harness.workloads import load_trace

from .test_fuzz_input import json_values, numbers

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
POOL = 64 * 1024

lines = st.one_of(
    json_values.map(json.dumps),
    st.fixed_dictionaries(
        {"id": st.text(max_size=5) | numbers, "prompt_tokens": st.integers(1, 4000) | numbers},
        optional={
            "arrival_round": st.integers(0, 5) | numbers,
            "prefix_group": st.text(max_size=3) | json_values,
            "prefix_tokens": st.integers(0, 100) | numbers,
            "device_prefix_tokens": st.sampled_from([0, 64, 128]) | numbers,
            "host_prefix_tokens": st.integers(0, 100) | numbers,
            "format": st.just("policykit-trace") | st.text(max_size=3),
            "version": st.just(1) | numbers,
        },
    ).map(json.dumps),
    st.text(max_size=30),
)


def _loads_or_explains(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("trace") / "t.jsonl"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    try:
        workload = load_trace(path, POOL)
    except PolicykitError as err:
        assert str(err) and len(str(err)) < 800
        return
    assert workload.prompt_tokens <= 6 * (1 << 24)
    if workload.prompt_tokens <= 100_000:
        workload.tokens()


@FUZZ
@given(body=st.lists(lines, max_size=6).map("\n".join))
@example(body='{"id": "a", "prompt_tokens": 1' + "0" * 5000 + "}")  # too many digits for int()
@example(body="[" * 100_000 + "]" * 100_000)  # deeper than the parser's recursion
@example(body='{"id": "a", "prompt_tokens": 1000000000000000000}')  # a prompt no pool holds
@example(body='{"id": "a", "prompt_tokens": NaN}')
@example(
    body="\n".join(json.dumps({"id": f"r{i % 3000}", "prompt_tokens": 5}) for i in range(6000))
)
def test_any_trace_loads_or_gives_a_workload_error(tmp_path_factory, body):
    _loads_or_explains(tmp_path_factory, body)
