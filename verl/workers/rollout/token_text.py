"""Generated tokens as OpenAI's log-probs show them: each token's own text and bytes, and how many tokens a
reply's text holds once cut at a stop string (:mod:`verl.workers.rollout.openai_api`'s ``logprobs``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

PARTIAL = "\ufffd"
"""what decoding gives for the bytes of a character that a token holds only part of"""
CONTEXT = 4
"""tokens decoded before each one to tell its own text: SentencePiece drops a leading space at the start"""


def decoded(tokenizer: Any, ids: Sequence[int], skip_special: bool) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special)


def tokens_in(tokenizer: Any, ids: list[int], length: int, skip_special: bool) -> int:
    """How many of ``ids`` a text cut to ``length`` characters holds: the longest prefix whose decoding fits
    (a binary search: decoding a longer prefix never gives a shorter text)."""
    low, high = 0, len(ids)
    while low < high:
        middle = (low + high + 1) // 2
        if len(decoded(tokenizer, ids[:middle], skip_special)) <= length:
            low = middle
        else:
            high = middle - 1
    return low


def token_pieces(
    tokenizer: Any, ids: list[int], skip_special: bool
) -> list[tuple[str, list[int] | None, int]]:
    """Each token as OpenAI's log-probs show it: its text, its UTF-8 bytes, where it starts in the reply.

    A token's text is what it adds to the decoding of the few tokens before it (a SentencePiece token alone
    loses its leading space). A token that holds part of a character, or ends one a token before it began,
    shows its own bytes instead (``bytes:\\xe6\\x97``, as vLLM writes it), read from the vocabulary's byte-level
    or byte-fallback piece, or None where the vocabulary does not say: no bytes are made up.
    """
    pieces = []
    for i, token in enumerate(ids):
        window = ids[max(0, i - CONTEXT) : i + 1]
        before = decoded(tokenizer, window[:-1], skip_special)
        after = decoded(tokenizer, window, skip_special)
        if after.startswith(before) and not after.endswith(PARTIAL):
            text = after[len(before) :]
            pieces.append((text, list(text.encode("utf-8"))))
        else:  # it begins or completes a character with bytes of another token
            raw = _token_bytes(tokenizer, token)
            pieces.append(
                ("bytes:" + "".join(f"\\x{b:02x}" for b in raw) if raw is not None else PARTIAL, raw)
            )
    return pieces


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet (GPT-2's, used by Qwen, Llama 3, SmolLM): each byte as a printable character
    (the printable ones as themselves, the others shifted past 255)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping


BYTE_OF_CHAR = {char: byte for byte, char in _bytes_to_unicode().items()}
HEX_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
"""SentencePiece's byte-fallback pieces (Llama 2, Mistral)"""


def _token_bytes(tokenizer: Any, token: int) -> list[int] | None:
    """A token's bytes from its vocabulary piece: byte-level (each character one byte) or byte fallback."""
    piece = tokenizer.convert_ids_to_tokens(token) or ""
    fallback = HEX_BYTE.fullmatch(piece)
    if fallback:
        return [int(fallback.group(1), 16)]
    if piece and all(char in BYTE_OF_CHAR for char in piece):
        return [BYTE_OF_CHAR[char] for char in piece]
    return None
