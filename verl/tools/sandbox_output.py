"""The python tool's output capture: a child's output read to its end, keeping only its head and tail."""

from __future__ import annotations

import asyncio
import codecs

_READ_CHUNK = 65536


class _Output:
    """A child's output read to the end while keeping only its first and last characters."""

    def __init__(self, head_chars: int, tail_chars: int) -> None:
        self.head_chars = head_chars
        self.tail_chars = tail_chars
        self.total_chars = 0
        self._head: list[str] = []
        self._head_len = 0
        self._tail = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    async def read_from(self, stream: asyncio.StreamReader) -> None:
        while True:
            chunk = await stream.read(_READ_CHUNK)
            if not chunk:
                self._add(self._decoder.decode(b"", final=True))
                return
            self._add(self._decoder.decode(chunk))

    def _add(self, text: str) -> None:
        if not text:
            return
        self.total_chars += len(text)
        if self._head_len < self.head_chars:
            piece = text[: self.head_chars - self._head_len]
            self._head.append(piece)
            self._head_len += len(piece)
        self._tail = (self._tail + text)[-self.tail_chars :]

    def head_text(self) -> str:
        return "".join(self._head)

    def tail_text(self) -> str:
        return self._tail
