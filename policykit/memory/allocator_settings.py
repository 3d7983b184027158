"""The caching-allocator setting string (``PYTORCH_CUDA_ALLOC_CONF`` syntax), read and rebuilt.

Why a parser at all: torch's setter does not *merge* a new string into the current settings, it
*replaces* them. Setting ``"expandable_segments:True"`` alone silently resets
``max_split_size_mb``, ``roundup_power2_divisions`` and ``garbage_collection_threshold`` to
their defaults. So a policy that flips expandable segments must take the user's whole string,
change that one key and hand the whole string back. Values may contain commas inside brackets
(``roundup_power2_divisions:[256:1,512:2,>:4]``), so a plain ``split(",")`` is not enough.

Booleans are written exactly ``True`` / ``False``: torch's tokenizer rejects ``true`` or ``1``
with a ``ValueError``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

EXPANDABLE = "expandable_segments"
BACKEND = "backend"

#: where torch reads the allocator settings from at start-up; the first one *present* wins,
#: even when it is set to the empty string
ENV_PRECEDENCE = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def split_settings(text: str) -> list[tuple[str, str]]:
    """``"a:1,b:[2,3]"`` -> ``[("a", "1"), ("b", "[2,3]")]``, in the user's order."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    pairs: list[tuple[str, str]] = []
    for part in parts:
        key, _, value = part.partition(":")
        if key.strip():
            pairs.append((key.strip(), value.strip()))
    return pairs


def join_settings(pairs: list[tuple[str, str]]) -> str:
    return ",".join(f"{key}:{value}" for key, value in pairs)


def expandable_enabled(text: str) -> bool:
    """Whether ``text`` turns expandable segments on (the last occurrence of the key wins)."""
    value = "False"
    for key, v in split_settings(text):
        if key == EXPANDABLE:
            value = v
    return value == "True"


def backend_of(text: str) -> str:
    """The allocator backend ``text`` selects: ``native`` unless it names another."""
    backend = "native"
    for key, v in split_settings(text):
        if key == BACKEND:
            backend = v
    return backend


def with_expandable(text: str, on: bool) -> str:
    """``text`` with only ``expandable_segments`` changed (kept in place, or appended)."""
    value = "True" if on else "False"
    pairs = split_settings(text)
    kept = [(k, value if k == EXPANDABLE else v) for k, v in pairs]
    if not any(k == EXPANDABLE for k, _ in pairs):
        kept.append((EXPANDABLE, value))
    return join_settings(kept)


def env_settings(environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The variable torch would read the settings from, and its value (``(None, "")``: none)."""
    env = os.environ if environ is None else environ
    for name in ENV_PRECEDENCE:
        if name in env:
            return name, env[name]
    return None, ""
