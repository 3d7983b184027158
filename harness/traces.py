"""Production traces as timed requests whose prompts share prefix blocks.

A trace says *when* each request arrived (seconds since the trace began), how long its prompt
is, and, when the trace knows it, which of its prompt's blocks it shares with other requests
(Mooncake's ``hash_ids``: block ``i`` holds tokens ``[512 i, 512 (i + 1))``, and equal ids are
equal KV). The scheduler sees tokens, so each block id becomes a run of token ids: block ``b``'s
token at offset ``j`` is ``b * block_tokens + j``. Two prompts therefore share exactly the
leading blocks the trace says they share, and the radix cache, eviction and the host tier see
the trace's reuse and nothing more. A trace without prefix information (Azure's) gets a fresh
block id per block of every request: no two requests share a token, and none is invented.

Prompts are laid out lazily (:class:`BlockTokens`): the whole Mooncake conversation trace is
145 M prompt tokens, which as tuples of Python ints would take gigabytes; a slice is only made
into a tuple when the scheduler asks for it. The scheduler slices the same few prompts many
times over (each match walks a prompt page by page, each release inserts its prefixes cut by
cut), and building the ints was most of a replay's time, so the prompts sliced last keep their
whole tuple while :data:`MATERIALISED_TOKENS` tokens' worth of them fit (about 150 MB).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from itertools import chain
from typing import Any, overload

#: Mooncake's hash block: 512 tokens
BLOCK_TOKENS = 512
#: tokens of the prompts kept whole at once (:meth:`BlockTokens.whole`), about 36 bytes each
MATERIALISED_TOKENS = 4_000_000
#: the prompts kept whole, oldest first, and how many tokens they hold
_whole: deque[BlockTokens] = deque()
_whole_tokens = [0]


class BlockTokens(Sequence[int]):
    """The token ids of a prompt made of blocks, materialised only slice by slice."""

    __slots__ = ("_block", "_blocks", "_length", "_tuple")

    def __init__(self, blocks: Sequence[int], length: int, block_tokens: int = BLOCK_TOKENS):
        if length > len(blocks) * block_tokens:
            raise ValueError("a prompt cannot be longer than its blocks")
        self._blocks = tuple(blocks)
        self._length = length
        self._block = block_tokens
        self._tuple: tuple[int, ...] | None = None

    def whole(self) -> tuple[int, ...]:
        """Every token id, built once while this prompt is among the last sliced (slicing a
        tuple copies pointers; building one makes a Python int per token)."""
        if self._tuple is None:
            self._tuple = tuple(self._run(0, self._length))
            _whole.append(self)
            _whole_tokens[0] += self._length
            while _whole_tokens[0] > MATERIALISED_TOKENS and len(_whole) > 1:
                oldest = _whole.popleft()
                _whole_tokens[0] -= oldest._length
                oldest._tuple = None
        return self._tuple

    def __len__(self) -> int:
        return self._length

    @property
    def blocks(self) -> tuple[int, ...]:
        return self._blocks

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):
            return (self._tuple or self.whole())[index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("token index out of range")
        return self._blocks[index // self._block] * self._block + index % self._block

    def _run(self, start: int, stop: int) -> Iterator[int]:
        size = self._block
        parts = []
        at = start
        while at < stop:
            block, offset = divmod(at, size)
            end = min(stop, (block + 1) * size)
            base = self._blocks[block] * size
            parts.append(range(base + offset, base + end - block * size))
            at = end
        return chain.from_iterable(parts)

    def __iter__(self) -> Iterator[int]:
        return self._run(0, self._length)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockTokens):
            return (self._blocks, self._length, self._block) == (
                other._blocks,
                other._length,
                other._block,
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._blocks, self._length, self._block))

    def __repr__(self) -> str:
        return f"BlockTokens({len(self._blocks)} blocks, {self._length} tokens)"


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: arrival time, prompt length and the prompt's blocks."""

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...]


@dataclass(frozen=True)
class Trace:
    """A whole trace, in arrival order."""

    name: str
    description: str
    source: str
    format: str
    requests: tuple[TraceRequest, ...]
    #: whether the trace says which prompts share prefixes (Mooncake: yes; Azure: no)
    has_prefixes: bool
    block_tokens: int = BLOCK_TOKENS
    citation: str | None = None

    def tokens(self, request: TraceRequest) -> BlockTokens:
        return BlockTokens(request.blocks, request.prompt_tokens, self.block_tokens)

    def head(self, count: int) -> Trace:
        """The first ``count`` requests (a declared slice)."""
        if count >= len(self.requests):
            return self
        return replace(
            self,
            requests=self.requests[:count],
            description=f"{self.description} First {count} of {len(self.requests)} requests.",
        )

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    def reusable_block_share(self) -> float:
        """Share of block occurrences whose block appeared earlier in the trace: the prefix
        hit rate, by blocks, of a cache that never evicts (Mooncake's conversation trace:
        36.6%). Zero for a trace without prefix information."""
        if not self.has_prefixes:
            return 0.0
        counts = Counter(b for r in self.requests for b in r.blocks)
        total = sum(counts.values())
        return (total - len(counts)) / total if total else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "source": self.source,
            "format": self.format,
            "citation": self.citation,
            "requests": len(self.requests),
            "prompt_tokens": self.prompt_tokens,
            "duration_s": self.duration_s,
            "has_prefixes": self.has_prefixes,
            "block_tokens": self.block_tokens,
            "reusable_block_share": self.reusable_block_share(),
        }


def fresh_blocks(prompt_tokens: int, first: int, block_tokens: int = BLOCK_TOKENS) -> tuple:
    """Block ids ``first, first + 1, ...`` covering a prompt that shares nothing."""
    return tuple(range(first, first + -(-prompt_tokens // block_tokens)))


def bundled_data(filename: str):
    """A file of the traces the package carries (``harness/trace_data``)."""
    return resources.files("policykit.harness").joinpath("trace_data", filename)
