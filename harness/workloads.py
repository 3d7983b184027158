"""Workloads: what arrives at the prefill node, sized to its KV pool.

A workload is requests (arrival round, prompt length, which prefix they share with whom) plus
where each request's prefix already lives when the run starts: in the device radix cache, in
the host tier, or nowhere. Named generators are seeded, so a name, a pool size and a seed always
give the same requests; a user replays real traffic from a JSONL trace (format in
``docs/harness.md``). Shapes are expressed as fractions of the pool because what makes a policy
crash is the ratio of prompts to memory, not their absolute size.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from policykit.config import EngineConfig
from policykit.errors import PolicykitError
from policykit.scenario import prefix_hit_problem

PAGE_SIZE = 64
#: chunk ends checkpoint-aligned to 256 leave a 192-token compute gap when the chunk budget is a
#: multiple of 1024 and the batch before the truncated request is 64 past a 256 boundary
_CHECKPOINT = 256
_ID_STRIDE = 1 << 40


class WorkloadError(PolicykitError):
    """A workload name, trace file or pool size the harness cannot run."""


@dataclass(frozen=True)
class RequestSpec:
    """One request. Its first ``prefix_tokens`` tokens are those of ``prefix_group`` (shared
    with every request of that group); the rest are its own.

    ``device_prefix_tokens`` leading tokens are in the device radix cache when the run starts
    (pinned: locked by requests outside the workload, so never evictable);
    ``host_prefix_tokens`` tokens after them are in the host tier.
    """

    id: str
    prompt_tokens: int
    arrival_round: int = 0
    prefix_group: str | None = None
    prefix_tokens: int = 0
    device_prefix_tokens: int = 0
    device_prefix_pinned: bool = False
    host_prefix_tokens: int = 0


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    pool_tokens: int
    #: the node it runs on (full attention: no sliding window)
    config: EngineConfig
    requests: tuple[RequestSpec, ...]
    source: str = "generator"

    def tokens(self) -> dict[str, tuple[int, ...]]:
        """Token ids of every request: group tokens first, then ids no other request has."""
        groups: dict[str, int] = {}
        out = {}
        for index, spec in enumerate(self.requests):
            own = (index + 1) * _ID_STRIDE
            if spec.prefix_group is None:
                out[spec.id] = tuple(range(own, own + spec.prompt_tokens))
                continue
            group = groups.setdefault(spec.prefix_group, len(groups) + 1)
            base = (len(self.requests) + group) * _ID_STRIDE
            rest = spec.prompt_tokens - spec.prefix_tokens
            out[spec.id] = tuple(range(base, base + spec.prefix_tokens)) + tuple(
                range(own, own + rest)
            )
        return out

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "page_size": self.config.page_size,
            "chunked_prefill_size": self.config.chunked_prefill_size,
            "max_prefill_tokens": self.config.max_prefill_tokens,
            "pool_tokens": self.pool_tokens,
            "kv_release_rounds": self.config.kv_release_rounds,
            "requests": len(self.requests),
            "prompt_tokens": self.prompt_tokens,
        }


def _paged(tokens: float, page: int = PAGE_SIZE) -> int:
    return max(page, int(tokens) // page * page)


def workload_config(chunked_prefill_size: int, kv_release_rounds: int | None = 2) -> EngineConfig:
    """A workload's node: ``PAGE_SIZE`` pages, and finished requests' KV held two rounds for
    the transfer to decode unless the workload says otherwise."""
    return EngineConfig(PAGE_SIZE, chunked_prefill_size, kv_release_rounds=kv_release_rounds)


def _chunk_budget(pool: int) -> int:
    """A quarter of the pool, in whole 1024s (so checkpoint alignment leaves its 192 gap)."""
    return max(1024, pool // 4 // 1024 * 1024)


# --- generators ------------------------------------------------------------------------------
def long_prompts(pool: int, seed: int) -> Workload:
    rng = random.Random(seed)
    reqs = [
        RequestSpec(f"long{i}", _paged(rng.uniform(0.3, 0.8) * pool) + rng.randrange(1, 64), i)
        for i in range(8)
    ]
    return Workload(
        "long-prompts",
        "Eight prompts of 30-80% of the pool, one per round: every one is chunked over several "
        "rounds, so the in-progress request and its tail dominate.",
        pool,
        workload_config(_chunk_budget(pool)),
        tuple(reqs),
    )


def host_hit_heavy(pool: int, seed: int) -> Workload:
    """The A/B/C shape of docs/incidents.md#truncated-tail, repeated in waves.

    Per wave: A computes ``chunk/4 + 64`` tokens, so the truncated B's chunk ends 192 tokens
    past a 256 checkpoint; B is a 55-65% prompt, chunked; then host hits C that each compute
    64-192 tokens (they fit the 192-token gap) but load back 40-45% of the pool.
    """
    rng = random.Random(seed)
    chunk = _chunk_budget(pool)
    reqs: list[RequestSpec] = []
    for wave in range(4):
        arrival = 1 + wave * 8
        reqs.append(RequestSpec(f"w{wave}a", chunk // 4 + 64, arrival))
        b = _paged(rng.uniform(0.55, 0.65) * pool) + rng.randrange(1, 64)
        reqs.append(RequestSpec(f"w{wave}b", b, arrival))
        for c in range(4):
            host = _paged(rng.uniform(0.40, 0.45) * pool)
            compute = rng.randrange(64, 193)
            reqs.append(
                RequestSpec(
                    f"w{wave}c{c}",
                    host + compute,
                    arrival,
                    prefix_group=f"w{wave}c{c}",
                    prefix_tokens=host,
                    host_prefix_tokens=host,
                )
            )
    return Workload(
        "host-hit-heavy",
        "The truncated-tail incident's shape in four waves: a short request, a long chunked "
        "one, then four host-tier hits that compute at most 192 tokens but each load back "
        "40-45% of the pool. KV is held "
        "six rounds for the transfer to decode.",
        pool,
        workload_config(chunk, kv_release_rounds=6),
        tuple(reqs),
    )


def shared_prefix(pool: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prefix = _paged(0.2 * pool)
    reqs: list[RequestSpec] = []
    for g, residency in enumerate(("device", "host", "none")):
        for i in range(4):
            suffix = rng.randrange(128, max(129, pool // 16))
            reqs.append(
                RequestSpec(
                    f"g{g}r{i}",
                    prefix + suffix,
                    1 + i * 2 + g,
                    prefix_group=f"g{g}",
                    prefix_tokens=prefix,
                    device_prefix_tokens=prefix if residency == "device" else 0,
                    host_prefix_tokens=prefix if residency == "host" else 0,
                )
            )
    reqs.sort(key=lambda r: r.arrival_round)
    return Workload(
        "shared-prefix",
        "Three groups of four requests sharing a 20%-of-pool prefix: one group's prefix starts in "
        "the device cache, one in the host tier, one nowhere (its first request computes it and "
        "the rest hit the cache once it is released).",
        pool,
        workload_config(_chunk_budget(pool)),
        tuple(reqs),
    )


def mixed(pool: int, seed: int) -> Workload:
    rng = random.Random(seed)
    prefix = _paged(0.15 * pool)
    reqs: list[RequestSpec] = []
    for i in range(16):
        kind = rng.choice(("short", "long", "shared", "host"))
        arrival = 1 + i
        if kind == "short":
            reqs.append(RequestSpec(f"m{i}", rng.randrange(64, pool // 16), arrival))
        elif kind == "long":
            reqs.append(RequestSpec(f"m{i}", _paged(rng.uniform(0.3, 0.6) * pool) + 17, arrival))
        elif kind == "shared":
            reqs.append(
                RequestSpec(
                    f"m{i}",
                    prefix + rng.randrange(64, pool // 16),
                    arrival,
                    prefix_group="sys",
                    prefix_tokens=prefix,
                    device_prefix_tokens=prefix,
                )
            )
        else:
            host = _paged(rng.uniform(0.2, 0.35) * pool)
            reqs.append(
                RequestSpec(
                    f"m{i}",
                    host + rng.randrange(64, 512),
                    arrival,
                    prefix_group=f"h{i}",
                    prefix_tokens=host,
                    host_prefix_tokens=host,
                )
            )
    return Workload(
        "mixed",
        "Sixteen requests, one per round, drawn from short prompts, long chunked prompts, "
        "requests sharing a device-cached system prompt and host-tier hits.",
        pool,
        workload_config(_chunk_budget(pool)),
        tuple(reqs),
    )


def seed_incident(pool: int, seed: int) -> Workload:
    """The 1keim incident (bundled scenario ``seed-incident-1keim``) scaled to ``pool``.

    The production pool held 108416 free tokens plus 1keim's 12992-token pinned prefix, with a
    16384-token chunk budget. Every length is scaled by ``pool / 121408`` and rounded to pages;
    v9uj is then nudged (a page at a time) so that 1keim's first chunk again ends 192 tokens past
    a 256 checkpoint: the gap xpkq (185 new tokens) slips through.
    """
    del seed  # the incident is one fixed trace
    scale = pool / 121_408
    chunk = max(1024, round(16_384 * scale / 1024) * 1024)
    device = _paged(12_992 * scale)
    host = _paged(73_792 * scale)
    start = device + host
    v9uj = _paged(13_888 / 16_384 * chunk)
    while (start + chunk - v9uj) % _CHECKPOINT != _CHECKPOINT - 64:
        v9uj -= PAGE_SIZE
    prompt = start + max(_paged(7240 * scale), 2 * (chunk - v9uj)) + 8
    xpkq_host = _paged(15_360 * scale)
    reqs = (
        RequestSpec("v9uj", v9uj, 0),
        RequestSpec(
            "1keim",
            prompt,
            0,
            prefix_group="1keim",
            prefix_tokens=start,
            device_prefix_tokens=device,
            device_prefix_pinned=True,
            host_prefix_tokens=host,
        ),
        RequestSpec(
            "xpkq",
            xpkq_host + 185,
            0,
            prefix_group="xpkq",
            prefix_tokens=xpkq_host,
            host_prefix_tokens=xpkq_host,
        ),
    )
    return Workload(
        "seed-incident",
        f"The truncated-tail production incident (request 1keim) scaled by {scale:.3f} to the "
        "pool: a "
        "long request with a pinned device prefix and a large host prefix, and a 185-token host "
        "hit that enters through the checkpoint gap. KV is held for the whole run.",
        pool,
        workload_config(chunk, kv_release_rounds=None),
        reqs,
    )


GENERATORS: dict[str, Callable[[int, int], Workload]] = {
    "long-prompts": long_prompts,
    "host-hit-heavy": host_hit_heavy,
    "shared-prefix": shared_prefix,
    "mixed": mixed,
    "seed-incident": seed_incident,
}
#: smallest pool that keeps a generator's shape (below it the seed-incident scaling rounds the
#: long request's pieces away and nothing interesting happens)
MIN_POOL_TOKENS: dict[str, int] = {"seed-incident": 8192}
_DEFAULT_MIN_POOL = 2048


def check_pool(pool_tokens: int, page_size: int = PAGE_SIZE) -> int:
    """The pool size rounded down to whole pages; an error if not even one page fits."""
    if pool_tokens < page_size:
        raise WorkloadError(
            f"A KV pool of {pool_tokens} tokens is smaller than one {page_size}-token page; "
            f"give --pool-tokens of at least {page_size} (workloads are sized for a few thousand "
            "tokens and up)."
        )
    return pool_tokens // page_size * page_size


def unknown_workload(name: str) -> WorkloadError:
    """The error for a name that is no workload (and no file): every name there is."""
    return WorkloadError(
        f"There is no workload named {name!r}. Named workloads: {', '.join(GENERATORS)}; "
        "production traces: mooncake-conversation, mooncake-synthetic, azure-code, "
        "azure-conv; or give the path of a trace file (Mooncake .jsonl, Azure .csv, "
        "policykit-trace .jsonl) or a scenario file (.json)."
    )


def generate(name: str, pool_tokens: int, seed: int = 0) -> Workload:
    """The named workload sized to ``pool_tokens``."""
    pool = check_pool(pool_tokens)
    try:
        make = GENERATORS[name]
    except KeyError:
        raise unknown_workload(name) from None
    least = MIN_POOL_TOKENS.get(name, _DEFAULT_MIN_POOL)
    if pool < least:
        raise WorkloadError(
            f"The {name!r} workload needs a pool of at least {least} tokens to keep its shape; "
            f"--pool-tokens {pool_tokens} is too small."
        )
    return make(pool, seed)


# --- JSONL traces ----------------------------------------------------------------------------
_HEADER = {"format", "version", "name", "description", "chunked_prefill_size", "kv_release_rounds"}
_LINE = {
    "id",
    "arrival_round",
    "prompt_tokens",
    "prefix_group",
    "prefix_tokens",
    "device_prefix_tokens",
    "device_prefix_pinned",
    "host_prefix_tokens",
}
TRACE_FORMAT = "policykit-trace"
_MAX_TOKENS = 1 << 24
TRACE_VERSION = 1


def _field_int(obj: dict, key: str, where: str, default: int | None, minimum: int = 0) -> Any:
    value = obj.get(key, default)
    if value is None and default is None and key not in obj:
        raise WorkloadError(f"{where} is missing the required field {key!r}.")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{where}: {key!r} must be an integer, got {value!r}.")
    if value < minimum:
        raise WorkloadError(f"{where}: {key!r} must be at least {minimum}, got {value}.")
    if value > _MAX_TOKENS:  # laying out such a prompt would take minutes and gigabytes
        raise WorkloadError(f"{where}: {key!r} = {value} is beyond any real context (max 2^24).")
    return value


def parse_trace_line(obj: Any, where: str, page: int = PAGE_SIZE) -> RequestSpec:
    """Validate one request line of a trace."""
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where} must be a JSON object, got {type(obj).__name__}.")
    extra = sorted(set(obj) - _LINE)
    if extra:
        raise WorkloadError(
            f"{where} has unknown field(s) {', '.join(map(repr, extra))}; allowed fields are "
            f"{', '.join(sorted(_LINE))}."
        )
    rid = obj.get("id")
    if not isinstance(rid, str) or not rid.strip():
        raise WorkloadError(f"{where}: 'id' must be a non-empty string, got {rid!r}.")
    where = f"{where} (request {rid!r})"
    prompt = _field_int(obj, "prompt_tokens", where, None, minimum=1)
    arrival = _field_int(obj, "arrival_round", where, 0)
    prefix = _field_int(obj, "prefix_tokens", where, 0)
    device = _field_int(obj, "device_prefix_tokens", where, 0)
    host = _field_int(obj, "host_prefix_tokens", where, 0)
    group = obj.get("prefix_group")
    pinned = obj.get("device_prefix_pinned", False)
    if group is not None and (not isinstance(group, str) or not group):
        raise WorkloadError(f"{where}: 'prefix_group' must be a non-empty string or null.")
    if not isinstance(pinned, bool):
        raise WorkloadError(f"{where}: 'device_prefix_pinned' must be true or false.")
    if prefix and group is None:
        raise WorkloadError(f"{where}: 'prefix_tokens' needs a 'prefix_group' to share with.")
    if prefix >= prompt:
        raise WorkloadError(
            f"{where}: its shared prefix ({prefix}) must be shorter than its {prompt}-token prompt."
        )
    problem = prefix_hit_problem(prompt, device, host, pinned, page)
    if problem:
        raise WorkloadError(f"{where}: {problem}")
    return RequestSpec(rid, prompt, arrival, group, prefix, device, pinned, host)


def load_trace(path: str | Path, pool_tokens: int) -> Workload:
    """Read a JSONL trace: an optional header line, then one request per line."""
    path = Path(path)
    pool = check_pool(pool_tokens)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise WorkloadError(f"Cannot read the trace {str(path)!r}: {exc.strerror}.") from None
    except UnicodeDecodeError:
        raise WorkloadError(f"The trace {str(path)!r} is not UTF-8 text.") from None
    header: dict[str, Any] = {}
    requests: list[RequestSpec] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"trace {path.name!r} line {number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{where} is not valid JSON: {exc.msg}.") from None
        except ValueError as exc:  # e.g. an integer with more digits than int() accepts
            raise WorkloadError(f"{where} is not valid JSON: {exc}.") from None
        except RecursionError:
            raise WorkloadError(f"{where} is nested too deeply to be a request.") from None
        if isinstance(obj, dict) and "format" in obj:
            if requests or header:
                raise WorkloadError(f"{where}: the header must be the first line.")
            header = _parse_header(obj, where)
            continue
        requests.append(parse_trace_line(obj, where))
    if not requests:
        raise WorkloadError(f"The trace {str(path)!r} has no requests.")
    ids = [r.id for r in requests]
    dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
    if dupes:
        shown = ", ".join(dupes[:5]) + (f" and {len(dupes) - 5} more" if len(dupes) > 5 else "")
        raise WorkloadError(f"The trace {path.name!r} repeats request id(s) {shown}.")
    chunk = header.get("chunked_prefill_size") or _chunk_budget(pool)
    return Workload(
        str(header.get("name") or path.stem),
        str(header.get("description") or f"trace {path.name}"),
        pool,
        workload_config(chunk, kv_release_rounds=header.get("kv_release_rounds", 2)),
        tuple(sorted(requests, key=lambda r: r.arrival_round)),
        source=str(path),
    )


def _parse_header(obj: dict, where: str) -> dict[str, Any]:
    extra = sorted(set(obj) - _HEADER)
    if extra:
        raise WorkloadError(
            f"{where}: unknown header field(s) {', '.join(map(repr, extra))}; allowed: "
            f"{', '.join(sorted(_HEADER))}."
        )
    if obj.get("format") != TRACE_FORMAT or obj.get("version") != TRACE_VERSION:
        raise WorkloadError(
            f'{where}: a header line says "format": "{TRACE_FORMAT}", "version": '
            f"{TRACE_VERSION}; got {obj.get('format')!r} version {obj.get('version')!r}."
        )
    _field_int(obj, "chunked_prefill_size", where, 0, minimum=0)
    if "kv_release_rounds" in obj:
        _field_int(obj, "kv_release_rounds", where, 0)
    if obj.get("chunked_prefill_size") is not None and obj["chunked_prefill_size"] < PAGE_SIZE:
        raise WorkloadError(f"{where}: 'chunked_prefill_size' must be at least one page.")
    return obj
