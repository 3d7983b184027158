"""Scenario files: a prefill node's state and a list of requests, as JSON.

A scenario is the smallest thing that reproduces a memory incident: the page and chunk sizes,
what the pool holds, and the requests in arrival order. Every field is checked before anything
runs, and a bad field gets an error that names it. The format is documented in
``docs/scenarios.md``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from policykit.config import EngineConfig
from policykit.errors import ScenarioError, quote
from policykit.kernel.swa import prefix_window
from policykit.node import PrefillNode
from policykit.pages import pages_for
from policykit.pool import TokenPool
from policykit.request import Request, State
from policykit.swa_cache import SWAPrefixCache, window_start
from policykit.tokens import TokenRuns

#: request ``i``'s token ids start at ``(i + 1) * _ID_STRIDE``: no two requests share a token
#: unless a workload says so, and the evictable filler uses the range below the first request
_ID_STRIDE = 1 << 40
#: beyond any real context length or KV pool (16Mi tokens); also what keeps a typo such as an
#: extra zero from building a pool or a prompt that takes minutes and gigabytes to lay out
_MAX_TOKENS = 1 << 24
#: all prompts together. A prompt is laid out as runs of ids (:class:`TokenRuns`), so its memory
#: does not grow with its length; this only stops a typo from asking for years of rounds. 2^30
#: is about 7 times the Mooncake conversation trace (12,031 requests, 145 M prompt tokens).
_MAX_TOTAL_PROMPT = 1 << 30

#: the engine configuration's keys, at the top level of a scenario
_CONFIG = set(EngineConfig.__dataclass_fields__)
_TOP = {"name", "description", "pool", "combo", "requests", "overtaking_bound"} | _CONFIG
#: ``sliding_window`` is also read here, where scenarios written before it joined the rest of
#: the configuration at the top level kept it
_POOL = {"free_tokens", "evictable_tokens", "swa_free_tokens", "sliding_window"}
_REQ = {
    "id",
    "prompt_tokens",
    "device_prefix_tokens",
    "device_prefix_pinned",
    "host_prefix_tokens",
    "arrival_round",
    "computed_tokens",
    "chunked",
}


@dataclass(frozen=True)
class RequestSpec:
    id: str
    prompt_tokens: int
    device_prefix_tokens: int = 0
    device_prefix_pinned: bool = False
    host_prefix_tokens: int = 0
    arrival_round: int = 0
    computed_tokens: int = 0
    chunked: bool = False


@dataclass(frozen=True)
class Scenario:
    config: EngineConfig
    free_tokens: int
    evictable_tokens: int
    requests: tuple[RequestSpec, ...]
    name: str = "scenario"
    description: str = ""
    #: hybrid SWA (``config.sliding_window`` set): the sliding-window pool's free tokens
    swa_free_tokens: int | None = None
    combo: dict[str, str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: ``simulate`` fails (exit 5) on a request overtaken by more later arrivals than this
    #: (:mod:`policykit.fairness`); None: no bound. A ``check`` counterexample of
    #: ``bounded-overtaking`` carries the bound it refuted, so it replays to that failure
    overtaking_bound: int | None = None

    def to_dict(self) -> dict[str, Any]:
        config = self.config
        pool: dict[str, Any] = {
            "free_tokens": self.free_tokens,
            "evictable_tokens": self.evictable_tokens,
        }
        if config.hybrid_swa:
            pool["swa_free_tokens"] = self.swa_free_tokens
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            **config_fields(config),
            "pool": pool,
            "requests": [],
        }
        if self.combo:
            out["combo"] = dict(self.combo)
        if self.overtaking_bound is not None:
            out["overtaking_bound"] = self.overtaking_bound
        for r in self.requests:
            item: dict[str, Any] = {"id": r.id, "prompt_tokens": r.prompt_tokens}
            for key, default in (
                ("device_prefix_tokens", 0),
                ("device_prefix_pinned", False),
                ("host_prefix_tokens", 0),
                ("arrival_round", 0),
                ("computed_tokens", 0),
                ("chunked", False),
            ):
                if getattr(r, key) != default:
                    item[key] = getattr(r, key)
            out["requests"].append(item)
        return out


def config_fields(config: EngineConfig) -> dict[str, Any]:
    """The configuration's keys as a scenario file has them: the optional ones only when set
    (``kv_release_rounds`` always: its ``null`` means never released, which is worth seeing)."""
    fields = config.to_dict()
    for key in ("sliding_window", "max_prefill_tokens"):
        if fields[key] is None:
            del fields[key]
    return fields


# --- validation helpers ------------------------------------------------------------------------
def _int(
    obj: dict, key: str, where: str, *, default: Any = ..., minimum: int = 0, nullable: bool = False
) -> Any:
    if key not in obj:
        if default is ...:
            raise ScenarioError(f"{where} is missing the required field {key!r}.")
        return default
    value = obj[key]
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where}: {key!r} must be an integer, got {quote(value)}.")
    if value < minimum:
        raise ScenarioError(f"{where}: {key!r} must be at least {minimum}, got {value}.")
    if value > _MAX_TOKENS:
        raise ScenarioError(
            f"{where}: {key!r} = {value} is beyond any real context or pool (max 2^24 = "
            f"{_MAX_TOKENS})."
        )
    return value


def _unknown(obj: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise ScenarioError(
            f"{where} has unknown field(s) {', '.join(map(quote, extra[:5]))}; allowed fields are "
            f"{', '.join(sorted(allowed))}."
        )


def _text(obj: dict, key: str, default: str, where: str) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise ScenarioError(f"{where}: {key!r} must be a string, got {quote(value)}.")
    return value


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ScenarioError(f"{where} must be a JSON object, got {type(value).__name__}.")
    return value


def parse_scenario(data: Any, *, source: str = "the scenario") -> Scenario:
    """Validate decoded JSON and build a :class:`Scenario`, or raise :class:`ScenarioError`."""
    top = _object(data, source)
    _unknown(top, _TOP, source)
    pool = _object(top.get("pool"), f"{source}: 'pool'") if "pool" in top else None
    if pool is None:
        raise ScenarioError(f"{source} is missing the required field 'pool'.")
    where = f"{source}: pool"
    _unknown(pool, _POOL, where)
    config = _parse_config(top, pool, source)
    page = config.page_size
    free = _int(pool, "free_tokens", where)
    evictable = _int(pool, "evictable_tokens", where, default=0)
    swa_free = _int(pool, "swa_free_tokens", where, default=None, nullable=True)
    if (swa_free is None) != (config.sliding_window is None):
        raise ScenarioError(
            f"{source}: hybrid SWA needs both 'sliding_window' and the pool's "
            "'swa_free_tokens' (or neither)."
        )
    for key, value in (("free_tokens", free), ("evictable_tokens", evictable)):
        if value % page:
            raise ScenarioError(
                f"{where}: {key!r} = {value} is not a whole number of {page}-token pages."
            )
    combo = top.get("combo")
    if combo is not None:
        combo = _object(combo, f"{source}: 'combo'")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in combo.items()):
            raise ScenarioError(f"{source}: 'combo' maps kinds to policy strings.")
    raw_requests = top.get("requests")
    if not isinstance(raw_requests, list):
        raise ScenarioError(f"{source}: 'requests' must be a list of request objects.")
    requests = [_parse_request(r, i, page, source) for i, r in enumerate(raw_requests)]
    total = sum(r.prompt_tokens for r in requests)
    if total > _MAX_TOTAL_PROMPT:
        raise ScenarioError(
            f"{source}: the prompts add up to {total} tokens, more than a scenario may hold "
            f"(2^30 = {_MAX_TOTAL_PROMPT})."
        )
    ids = [r.id for r in requests]
    dupes = sorted(i for i, n in Counter(ids).items() if n > 1)
    if dupes:
        raise ScenarioError(
            f"{source}: request id(s) {', '.join(map(quote, dupes[:5]))} appear twice."
        )
    chunked = [r.id for r in requests if r.chunked]
    if len(chunked) > 1:
        raise ScenarioError(
            f"{source}: requests {', '.join(map(repr, chunked))} are all marked 'chunked'; a "
            "prefill node has at most one in-progress chunked request."
        )
    unpinned = sum(r.device_prefix_tokens for r in requests if not r.device_prefix_pinned)
    if unpinned > evictable:
        raise ScenarioError(
            f"{where}: 'evictable_tokens' = {evictable} cannot hold the {unpinned} tokens of "
            "unpinned device prefixes; unpinned cached prefixes are part of the evictable total."
        )
    if swa_free is not None and swa_free < page:
        raise ScenarioError(f"{where}: 'swa_free_tokens' must hold at least one page.")
    return Scenario(
        config=config,
        free_tokens=free,
        evictable_tokens=evictable,
        requests=tuple(requests),
        name=_text(top, "name", "scenario", source),
        description=_text(top, "description", "", source),
        swa_free_tokens=swa_free,
        combo=combo,
        overtaking_bound=_int(top, "overtaking_bound", source, default=None, nullable=True),
    )


def _parse_config(top: dict, pool: dict, source: str) -> EngineConfig:
    """The engine configuration at the scenario's top level (``sliding_window`` also read
    from the pool, where older scenarios have it; not in both)."""
    if "sliding_window" in top and "sliding_window" in pool:
        raise ScenarioError(
            f"{source} gives 'sliding_window' twice, at the top level and in 'pool': keep the "
            "top-level one."
        )
    window_at = top if "sliding_window" in top else pool
    where = source if window_at is top else f"{source}: pool"
    return EngineConfig(
        page_size=_int(top, "page_size", source, minimum=1),
        chunked_prefill_size=_int(top, "chunked_prefill_size", source, minimum=1),
        sliding_window=_int(
            window_at, "sliding_window", where, default=None, minimum=1, nullable=True
        ),
        max_prefill_tokens=_int(
            top, "max_prefill_tokens", source, default=None, minimum=1, nullable=True
        ),
        kv_release_rounds=_int(
            top, "kv_release_rounds", source, default=None, minimum=0, nullable=True
        ),
    )


def _parse_request(raw: Any, index: int, page: int, source: str) -> RequestSpec:
    where = f"{source}: request #{index + 1}"
    obj = _object(raw, where)
    _unknown(obj, _REQ, where)
    rid = obj.get("id")
    if not isinstance(rid, str | int) or isinstance(rid, bool) or str(rid).strip() == "":
        raise ScenarioError(f"{where}: 'id' must be a non-empty string, got {quote(rid)}.")
    rid = str(rid)
    where = f"{source}: request {quote(rid)}"
    prompt = _int(obj, "prompt_tokens", where, minimum=1)
    device = _int(obj, "device_prefix_tokens", where, default=0)
    host = _int(obj, "host_prefix_tokens", where, default=0)
    arrival = _int(obj, "arrival_round", where, default=0)
    computed = _int(obj, "computed_tokens", where, default=0)
    pinned = obj.get("device_prefix_pinned", False)
    chunked = obj.get("chunked", False)
    for key, value in (("device_prefix_pinned", pinned), ("chunked", chunked)):
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: {key!r} must be true or false, got {quote(value)}.")
    problem = prefix_hit_problem(prompt, device, host, pinned, page)
    if problem:
        raise ScenarioError(f"{where}: {problem}")
    if chunked != bool(computed):
        raise ScenarioError(
            f"{where}: an in-progress request has both 'chunked': true and 'computed_tokens' > 0."
        )
    if chunked and not (device + host <= computed < prompt):
        raise ScenarioError(
            f"{where}: 'computed_tokens' = {computed} must cover its prefix hits and leave "
            f"something of the {prompt}-token prompt to compute."
        )
    if chunked and arrival:
        raise ScenarioError(f"{where}: the in-progress chunked request is there from round 1.")
    return RequestSpec(rid, prompt, device, pinned, host, arrival, computed, chunked)


def prefix_hit_problem(prompt: int, device: int, host: int, pinned: bool, page: int) -> str | None:
    """What is wrong with a request's prefix hits, or ``None``; shared by every loader of
    requests (scenarios here, harness traces) so they refuse the same things the same way."""
    if device % page:
        return (
            f"'device_prefix_tokens' = {device} is not a whole number of {page}-token pages; a "
            "cached prefix is matched a page at a time."
        )
    if device + host >= prompt:
        return (
            f"its prefix hits (device {device} + host {host}) must be shorter than the "
            f"{prompt}-token prompt, which needs at least one token to compute."
        )
    if pinned and not device:
        return "'device_prefix_pinned' without a device prefix."
    return None


def bundled_scenarios() -> dict[str, Path]:
    """Scenarios shipped with policykit, by name (usable instead of a path)."""
    folder = resources.files("policykit") / "scenarios"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir() if str(p).endswith(".json")}


def resolve_scenario_path(arg: str) -> Path:
    """A scenario file's path, or a bundled scenario's by name."""
    path = Path(arg)
    if path.exists():
        return path
    bundled = bundled_scenarios()
    if arg in bundled:
        return bundled[arg]
    raise ScenarioError(
        f"There is no scenario file {arg!r}, and no bundled scenario of that name (bundled: "
        f"{', '.join(sorted(bundled))})."
    )


def pool_tokens(scenario: Scenario) -> int:
    """The size of the scenario's KV pool, as :func:`build_node` lays it out."""
    page = scenario.config.page_size
    pinned = sum(r.device_prefix_tokens for r in scenario.requests if r.device_prefix_pinned)
    chunked_kv = sum(
        pages_for(r.computed_tokens - r.device_prefix_tokens, page) * page
        for r in scenario.requests
        if r.chunked
    )
    return scenario.free_tokens + scenario.evictable_tokens + pinned + chunked_kv


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"Cannot read the scenario {str(path)!r}: {exc.strerror}.") from None
    except UnicodeDecodeError:
        raise ScenarioError(f"The scenario {str(path)!r} is not UTF-8 text.") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ScenarioError(f"The scenario {str(path)!r} is not valid JSON: {exc}.") from None
    except RecursionError:
        raise ScenarioError(f"The scenario {str(path)!r} is nested too deeply.") from None
    return parse_scenario(data, source=f"scenario {path.name!r}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


# --- building the node -------------------------------------------------------------------------
def build_node(scenario: Scenario, device: str | torch.device = "cpu") -> PrefillNode:
    """Lay out the pool, cache and host tier the scenario describes, and queue its requests.

    The pool holds free + evictable + pinned device prefixes + the in-progress request's KV.
    """
    page = scenario.config.page_size
    window = scenario.config.sliding_window
    total = pool_tokens(scenario)
    if total < page:
        raise ScenarioError(
            f"scenario {scenario.name!r}: the pool holds {total} tokens, less than one page."
        )
    pool = TokenPool(total, page, device=device)
    swa = None
    if window is not None and scenario.swa_free_tokens is not None:
        swa = TokenPool(swa_pool_tokens(scenario), page, device=device, name="swa")
    node = PrefillNode(scenario.config, pool, swa_pool=swa)
    cache, host = node.cache, node.host

    requests = []
    for i, spec in enumerate(scenario.requests):
        base = (i + 1) * _ID_STRIDE
        tokens = TokenRuns.span(base, spec.prompt_tokens)
        requests.append(Request(spec.id, tokens, arrival_round=spec.arrival_round))

    # cached device prefixes, then the anonymous evictable remainder
    for spec, req in zip(scenario.requests, requests, strict=True):
        if spec.device_prefix_tokens:
            n = spec.device_prefix_tokens
            prefix = req.tokens[:n]
            if isinstance(cache, SWAPrefixCache) and swa is not None:
                live = window_start(n, window, page)
                cache.insert_swa(prefix, pool.alloc(n // page), swa.alloc((n - live) // page), live)
            else:
                cache.insert(prefix, pool.alloc(n // page))
            if spec.device_prefix_pinned:
                _, last, _ = cache.match(prefix)
                cache.pin(last)  # held by requests outside the scenario
    filler = scenario.evictable_tokens - sum(
        s.device_prefix_tokens for s in scenario.requests if not s.device_prefix_pinned
    )
    if filler:
        cache.insert(TokenRuns.span(0, filler), pool.alloc(filler // page))
    for spec, req in zip(scenario.requests, requests, strict=True):
        # SGLang 0.5.23's HiCache backs a node's ancestors up before the node: a host run of
        # whole pages comes with its device prefix on the host too (one under a page is no
        # node at all)
        if spec.host_prefix_tokens >= page:
            run = req.tokens[: spec.device_prefix_tokens + spec.host_prefix_tokens]
            host.put(run, spec.device_prefix_tokens, held_from=0)
    for spec, req in zip(scenario.requests, requests, strict=True):
        node.add(req)
        if spec.chunked:
            _start_in_progress(node, req, spec)
    if pool.free_tokens != scenario.free_tokens:
        raise AssertionError("scenario layout left the pool in an unexpected state")
    return node


def swa_pool_tokens(scenario: Scenario) -> int:
    """The sliding-window pool of a hybrid-SWA scenario: its free sliding-window tokens (whole
    pages) plus what the layout keeps live. Each cached device prefix keeps its last window
    (:func:`~policykit.swa_cache.window_start`), the filler none, the in-progress request its
    own KV from its last window on. The scenario's ``swa_free_tokens`` is what is free."""
    page, window = scenario.config.page_size, scenario.config.sliding_window
    assert scenario.swa_free_tokens is not None and window is not None
    total = scenario.swa_free_tokens // page * page
    for r in scenario.requests:
        n = r.device_prefix_tokens
        total += prefix_window(n, window, page)
        if r.chunked:
            start = max(n, window_start(r.computed_tokens, window, page))
            total += pages_for(r.computed_tokens, page) * page - start
    return max(total, page)


def _start_in_progress(node: PrefillNode, req: Request, spec: RequestSpec) -> None:
    cache = node.cache
    node.future.remove(req)
    cached, last, pages = cache.match(req.tokens)
    cache.lock(last)
    req.prefix_node, req.prefix_pages, req.cached_len = last, pages, cached
    own = spec.computed_tokens - cached
    req.own_pages = node.pool.alloc(math.ceil(own / node.config.page_size))
    req.seq_len = spec.computed_tokens
    if node.swa_pool is not None:
        # its KV out of the window is gone already: freed at its last checkpoint
        window, page = node.config.sliding_window, node.config.page_size
        gone = window_start(spec.computed_tokens, window, page)
        start = max(cached, gone)
        req.swa_pages = node.swa_pool.alloc(pages_for(spec.computed_tokens, page) - start // page)
        node.start_progress(req, cached, start, gone if gone > cached else 0)
    req.state = State.CHUNKED
    req.first_scheduled_round = 0
    node.chunked = req
