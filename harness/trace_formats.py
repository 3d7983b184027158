"""Reading production traces: Mooncake's JSONL, Azure's CSV, and the four the package carries.

Every check names the file, the line and the field, so that a user's trace that does not fit
gets one paragraph saying what to fix (the CLI turns :class:`WorkloadError` into exit code 2).
The formats, with examples, are in ``docs/traces.md``.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from policykit.harness.traces import BLOCK_TOKENS, Trace, TraceRequest, bundled_data, fresh_blocks
from policykit.harness.workloads import TRACE_FORMAT, WorkloadError

#: the largest prompt a trace line may give (beyond any real context)
MAX_PROMPT_TOKENS = 1 << 24

_MOONCAKE_CITATION = (
    "Qin et al., 'Mooncake: Trading More Storage for Less Computation', USENIX FAST 2025; "
    "data: github.com/kvcache-ai/Mooncake (Apache-2.0)"
)
_AZURE_CITATION = (
    "Patel et al., 'Splitwise: Efficient Generative LLM Inference Using Phase Splitting', "
    "ISCA 2024; data: github.com/Azure/AzurePublicDataset, AzureLLMInferenceTrace 2023 "
    "(CC-BY-4.0)"
)

#: name -> (file under harness/trace_data, format, description, citation)
BUNDLED: dict[str, tuple[str, str, str, str]] = {
    "mooncake-conversation": (
        "mooncake-conversation.jsonl.gz",
        "mooncake",
        "Mooncake FAST'25 conversation trace: 12,031 requests sampled from one hour of Kimi's "
        "online traffic, with 512-token prefix blocks (hash_ids).",
        _MOONCAKE_CITATION,
    ),
    "mooncake-synthetic": (
        "mooncake-synthetic.jsonl.gz",
        "mooncake",
        "Mooncake synthetic trace: 3,993 requests with Poisson arrivals and 512-token prefix "
        "blocks.",
        _MOONCAKE_CITATION,
    ),
    "azure-code": (
        "azure-2023-code.csv.gz",
        "azure",
        "Azure LLM inference trace 2023, code: arrival times and lengths, no prefix "
        "information (no request shares a token with another).",
        _AZURE_CITATION,
    ),
    "azure-conv": (
        "azure-2023-conv.csv.gz",
        "azure",
        "Azure LLM inference trace 2023, conversation: arrival times and lengths, no prefix "
        "information (no request shares a token with another).",
        _AZURE_CITATION,
    ),
}


def _read_text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise WorkloadError(f"Cannot read the trace {str(path)!r}: {exc.strerror}.") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise WorkloadError(
                f"The trace {str(path)!r} is not a valid gzip file: {exc}."
            ) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise WorkloadError(f"The trace {str(path)!r} is not UTF-8 text.") from None


def detect_format(text: str) -> str | None:
    """``mooncake``, ``azure``, ``policykit-trace`` or ``None`` from the first line."""
    first = next((line for line in text.splitlines() if line.strip()), "")
    if first.lstrip("\ufeff").startswith("TIMESTAMP"):
        return "azure"
    try:
        obj = json.loads(first)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if "hash_ids" in obj or "input_length" in obj:
        return "mooncake"
    if obj.get("format") == TRACE_FORMAT or "prompt_tokens" in obj:
        return TRACE_FORMAT
    return None


def _int(obj: dict[str, Any], key: str, where: str, minimum: int = 0) -> int:
    if key not in obj:
        raise WorkloadError(f"{where} is missing the required field {key!r}.")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(f"{where}: {key!r} must be an integer, got {value!r}.")
    if not minimum <= value <= MAX_PROMPT_TOKENS * 1000:
        raise WorkloadError(f"{where}: {key!r} = {value} is out of range (min {minimum}).")
    return value


def _mooncake_line(obj: Any, where: str, index: int) -> TraceRequest:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where} must be a JSON object, got {type(obj).__name__}.")
    stamp = _int(obj, "timestamp", where)
    prompt = _int(obj, "input_length", where, minimum=1)
    if prompt > MAX_PROMPT_TOKENS:
        raise WorkloadError(f"{where}: 'input_length' = {prompt} is beyond any real context.")
    output = _int(obj, "output_length", where)
    blocks = obj.get("hash_ids")
    if not isinstance(blocks, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in blocks
    ):
        raise WorkloadError(f"{where}: 'hash_ids' must be a list of non-negative integers.")
    need = -(-prompt // BLOCK_TOKENS)
    if len(blocks) != need:
        raise WorkloadError(
            f"{where}: an {prompt}-token prompt has {need} blocks of {BLOCK_TOKENS} tokens, but "
            f"'hash_ids' lists {len(blocks)}."
        )
    return TraceRequest(f"r{index}", stamp / 1000, prompt, output, tuple(blocks))


def _json_lines(text: str, name: str) -> Iterator[tuple[str, Any]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"trace {name!r} line {number}"
        try:
            yield where, json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise WorkloadError(f"{where} is not valid JSON: {exc}.") from None


def parse_mooncake(text: str, name: str) -> list[TraceRequest]:
    """Mooncake JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``."""
    requests = [
        _mooncake_line(obj, where, i) for i, (where, obj) in enumerate(_json_lines(text, name))
    ]
    _check_prefix_chains(requests, name)
    return requests


def _check_prefix_chains(requests: list[TraceRequest], name: str) -> None:
    """Equal block ids must mean equal prefixes: every id always follows the same id (a
    Mooncake hash covers its block and everything before it). A trace breaking this would
    make two prompts share a block without sharing what precedes it, which no KV cache can."""
    before: dict[int, int | None] = {}
    for req in requests:
        for i, block in enumerate(req.blocks):
            prev = req.blocks[i - 1] if i else None
            seen = before.setdefault(block, prev)
            if seen != prev:
                raise WorkloadError(
                    f"Trace {name!r}, request {req.id}: block {block} follows "
                    f"{'nothing' if prev is None else prev} here but "
                    f"{'nothing' if seen is None else seen} earlier; a hash id must stand for "
                    "the same prefix everywhere."
                )


def _azure_seconds(text: str, where: str) -> float:
    """Seconds since the epoch of ``2023-11-16 18:17:03.9799600`` (7 fraction digits)."""
    whole, _, fraction = text.strip().partition(".")
    try:
        stamp = dt.datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)
        frac = float(f"0.{fraction}") if fraction else 0.0
    except ValueError:
        raise WorkloadError(
            f"{where}: TIMESTAMP {text!r} is not of the form 2023-11-16 18:17:03.9799600."
        ) from None
    return stamp.timestamp() + frac


def parse_azure(text: str, name: str) -> list[TraceRequest]:
    """Azure CSV: ``TIMESTAMP``, ``ContextTokens``, ``GeneratedTokens``; no prefixes."""
    rows = csv.DictReader(io.StringIO(text.lstrip("\ufeff")))
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(rows.fieldnames or ())
    if missing:
        raise WorkloadError(
            f"Trace {name!r} is missing the CSV column(s) {', '.join(sorted(missing))}; an Azure "
            "trace's header is TIMESTAMP,ContextTokens,GeneratedTokens."
        )
    out: list[TraceRequest] = []
    first: float | None = None
    next_block = 0
    for number, row in enumerate(rows, start=2):
        where = f"trace {name!r} line {number}"
        seconds = _azure_seconds(row["TIMESTAMP"] or "", where)
        first = seconds if first is None else first
        try:
            prompt, output = int(row["ContextTokens"]), int(row["GeneratedTokens"])
        except (TypeError, ValueError):
            raise WorkloadError(
                f"{where}: ContextTokens and GeneratedTokens must be integers."
            ) from None
        if not 1 <= prompt <= MAX_PROMPT_TOKENS or output < 0:
            raise WorkloadError(
                f"{where}: ContextTokens {prompt} / GeneratedTokens {output} out of range."
            )
        blocks = fresh_blocks(prompt, next_block)
        next_block += len(blocks)
        out.append(TraceRequest(f"r{len(out)}", seconds - first, prompt, output, blocks))
    return out


def load_trace_file(path: str | Path, *, name: str | None = None) -> Trace:
    """A Mooncake or Azure trace file (plain or gzip), its format told by its first line."""
    path = Path(path)
    text = _read_text(path)
    fmt = detect_format(text)
    label = name or path.name.removesuffix(".gz")
    if fmt == "mooncake":
        requests = parse_mooncake(text, path.name)
    elif fmt == "azure":
        requests = parse_azure(text, path.name)
    else:
        raise WorkloadError(
            f"Cannot tell the format of the trace {str(path)!r}: its first line is neither a "
            "Mooncake JSON object (timestamp, input_length, output_length, hash_ids), an Azure "
            f"CSV header (TIMESTAMP,ContextTokens,GeneratedTokens) nor a {TRACE_FORMAT} line. "
            "See docs/traces.md for the formats."
        )
    if not requests:
        raise WorkloadError(f"The trace {str(path)!r} has no requests.")
    requests.sort(key=lambda r: r.arrival_s)  # stable: ties keep the file's order
    return Trace(
        label,
        f"trace {path.name}",
        str(path),
        fmt,
        tuple(requests),
        has_prefixes=fmt == "mooncake",
    )


def load_bundled(name: str) -> Trace:
    """One of the traces the package carries, by name."""
    filename, fmt, description, citation = BUNDLED[name]
    with bundled_data(filename).open("rb") as handle:
        text = gzip.decompress(handle.read()).decode("utf-8")
    parse = parse_mooncake if fmt == "mooncake" else parse_azure
    requests = sorted(parse(text, filename), key=lambda r: r.arrival_s)
    return Trace(
        name,
        description,
        f"bundled:{filename}",
        fmt,
        tuple(requests),
        has_prefixes=fmt == "mooncake",
        citation=citation,
    )


def unreadable_workload(path: Path) -> WorkloadError:
    """The error for a file that exists but is no workload: what its content starts with, and
    what each kind of workload file starts with instead (not "no workload named", which would
    send the user looking for a typo in a path that is right)."""
    first = next((line for line in _read_text(path).splitlines() if line.strip()), "")
    shown = f"starts with {first[:80]!r}" if first else "is empty"
    return WorkloadError(
        f"The file {str(path)!r} is not a workload: it {shown}. A Mooncake trace is JSON "
        "lines with 'input_length' (or 'hash_ids'), an Azure trace a CSV whose header starts "
        "with TIMESTAMP, a policykit-trace JSON lines with 'prompt_tokens' (a .jsonl file), "
        "and a scenario a JSON object in a .json file."
    )


def is_trace_workload(arg: str) -> bool:
    """Whether ``bench --workload arg`` names a timed trace (bundled, or a Mooncake/Azure
    file); a ``policykit-trace`` file is a round-based workload (:func:`load_trace`)."""
    if arg in BUNDLED:
        return True
    path = Path(arg)
    if not path.is_file() or path.suffix == ".json":
        return False
    return detect_format(_read_text(path)) in ("mooncake", "azure")


def resolve_trace(arg: str) -> Trace:
    return load_bundled(arg) if arg in BUNDLED else load_trace_file(arg)
