"""An attempt's output as numbered `log` chunks, resumable after a `kill -9` of the agent.

The output is a byte stream that outlives the agent (the process launcher's output file, the
engine's log of a container), and every chunk is a known range of it: chunk `seq` holds the
bytes `[start, end)`, decoded as UTF-8 on its own. Before a chunk is handed to the outbox its
`LogMark` is written to the agent's journal. A restarted agent reads the last mark and cuts
that chunk again, the same bytes under the same number: if the outbox had kept it or the
portal had acknowledged it, the repeat is a no-op (reports are idempotent by their number);
if the agent died between the mark and the outbox, the chunk is sent now. Either way the log
goes on from the mark's end with the next number, with no byte lost or shown twice.

Lines the agent writes itself (`[agent] ...` notes) are no range of the output: their mark
keeps their text, so the repeat is the same note.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass

from workers.protocol import LOG_CHUNK_MAX_BYTES

# Longest note the agent writes into a log (one chunk, with room to spare).
NOTE_MAX_CHARS = 1000


@dataclass(frozen=True)
class LogMark:
    """Chunk `seq` of an attempt's log: the output bytes `[start, end)`, or `note` (the
    agent's own text, read at `start == end`)."""

    seq: int
    start: int
    end: int
    note: str | None = None


def decode_prefix(data: bytes, *, final: bool) -> tuple[str, int]:
    """The text of the longest prefix of `data` that ends on a character boundary and how
    many bytes it took. Invalid bytes become U+FFFD; an incomplete character at the end is
    left for later unless `final`."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text = decoder.decode(data, final=final)
    pending, _ = decoder.getstate()
    return text, len(data) - len(pending)


class LogShipper:
    """Cuts an attempt's output into chunks and emits each one after marking it.

    `emit(seq, text)` returns False when the outbox refused the chunk (its bound for one
    attempt is reached): the shipper then drops the rest and says so once at the end.
    `mark(LogMark)` records the chunk before it is emitted (the journal)."""

    def __init__(
        self,
        emit: Callable[[int, str], bool],
        mark: Callable[[LogMark], None] = lambda _: None,
        *,
        max_bytes: int = LOG_CHUNK_MAX_BYTES,
    ) -> None:
        self._emit = emit
        self._mark = mark
        self._max_bytes = max_bytes
        self.seq = 0  # the next chunk's number
        self.offset = 0  # output bytes cut into chunks (or dropped) so far
        self.dropped_bytes = 0
        self._buffer = b""  # output read past `offset`, not cut yet
        self._replay_end: int | None = None  # the resumed chunk ends here, exactly
        self._full = False

    def resume(self, mark: LogMark) -> None:
        """Go on from a restarted agent's last mark: cut that chunk again, then the rest.
        The output must then be fed from `offset`."""
        self.seq, self.offset = mark.seq, mark.start
        if mark.note is not None:
            self.note(mark.note)
        else:
            self._replay_end = mark.end

    def note(self, text: str) -> None:
        """A line of the agent's own at this point of the log (one chunk)."""
        text = text[:NOTE_MAX_CHARS]
        if self._full:
            return
        self._send(LogMark(self.seq, self.offset, self.offset, note=text), text)

    def feed(self, data: bytes) -> None:
        self._buffer += data
        self._cut(final=False)

    def close(self) -> None:
        """The output has ended: cut what is left, then the note of what was dropped."""
        self._cut(final=True)
        if self.dropped_bytes:
            self._full = False
            self.note(
                f"\n[agent] {self.dropped_bytes} bytes of output dropped: the outbox bound "
                "for one attempt (PORTAL_AGENT_OUTBOX_LOG_MB) was reached while the portal "
                "was out of reach\n"
            )

    def _cut(self, *, final: bool) -> None:
        while self._buffer:
            if self._replay_end is not None:
                size = self._replay_end - self.offset
                if len(self._buffer) < size and not final:
                    return  # the resumed chunk's bytes are not all read yet
                text, used = decode_prefix(self._buffer[:size], final=True)
                self._replay_end = None
            else:
                text, used = self._next_piece(final=final)
                if used == 0:
                    return  # only the start of a character: wait for the rest
            start = self.offset
            self._buffer = self._buffer[used:]
            self.offset += used
            if self._full:
                self.dropped_bytes += used
                continue
            self._send(LogMark(self.seq, start, start + used), text)
            if self._full:
                self.dropped_bytes += used

    def _next_piece(self, *, final: bool) -> tuple[str, int]:
        """The next chunk: at most `max_bytes` of text. Each invalid byte becomes the
        three bytes of U+FFFD, so a window of a third of that always fits."""
        window = self._buffer[: self._max_bytes]
        # An unfinished character at the window's edge waits for the next piece, unless the
        # output has ended there.
        text, used = decode_prefix(window, final=final and len(window) == len(self._buffer))
        if len(text.encode()) > self._max_bytes:
            text, used = decode_prefix(window[: self._max_bytes // 3], final=False)
        return text, used

    def _send(self, mark: LogMark, text: str) -> None:
        self._mark(mark)
        if self._emit(mark.seq, text):
            self.seq += 1
        else:
            self._full = True
