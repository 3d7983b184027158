"""A tiny Llama and a word-level tokenizer, written locally, for a real ``vllm serve`` on a CPU.

Nothing can be downloaded from a model hub here, and only scheduling is under test, so the
model is a config alone (vLLM's ``--load-format dummy`` fills the weights at random) and the
tokenizer maps the words ``w0`` ... ``wN`` one-to-one onto token ids. A prompt of ``n`` such
words is then exactly ``n`` tokens, which is what lets the server check key each request by
its prompt length (request ids are random per run).
"""

from __future__ import annotations

from pathlib import Path

#: the tokenizer's vocabulary, and the model's: every id the sampler can draw decodes
VOCAB_SIZE = 512
#: ids 0 and 1 are the unknown token and end of sequence; the words take the rest
SPECIALS = ("<unk>", "</s>")
WORDS = VOCAB_SIZE - len(SPECIALS)


def vocabulary() -> dict[str, int]:
    """``<unk>``, ``</s>``, then ``w0`` ... ``w509``, each its own id."""
    vocab = {token: index for index, token in enumerate(SPECIALS)}
    for word in range(WORDS):
        vocab[f"w{word}"] = len(SPECIALS) + word
    return vocab


def prompt_text(index: int, length: int) -> str:
    """``length`` words, different for each ``index`` from the first word on, so that no two
    prompts share a cached block (the comparison is about scheduling, not prefix hits)."""
    return " ".join(f"w{(index * 97 + position * 7) % WORDS}" for position in range(length))


def write_tokenizer(directory: Path) -> None:
    """``tokenizer.json`` (a WordLevel model split on whitespace, no special tokens added to a
    prompt) and ``tokenizer_config.json``, as ``transformers`` saves a fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(vocab=vocabulary(), unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", eos_token="</s>", model_max_length=4096
    )
    fast.save_pretrained(directory)


def write_config(directory: Path, max_positions: int = 4096) -> None:
    """A 2-layer Llama config (head size 64, which vLLM's CPU attention takes)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=None,
        eos_token_id=SPECIALS.index("</s>"),
        dtype="bfloat16",
    )
    config.save_pretrained(directory)


def build(directory: Path) -> Path:
    """Write the model directory (config and tokenizer; no weights) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    write_config(directory)
    write_tokenizer(directory)
    return directory
