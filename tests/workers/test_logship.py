"""Log chunks as byte ranges of the output, resumable after the agent is killed anywhere."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workers.logship import LogMark, LogShipper, decode_prefix


class Portal:
    """Keeps the first chunk of each number, as the portal does (repeats are no-ops)."""

    def __init__(self) -> None:
        self.chunks: dict[int, str] = {}

    def emit(self, seq: int, text: str) -> bool:
        self.chunks.setdefault(seq, text)
        return True

    def text(self) -> str:
        assert sorted(self.chunks) == list(range(len(self.chunks))), "a chunk is missing"
        return "".join(self.chunks[seq] for seq in range(len(self.chunks)))


def ship(data: bytes, reads: list[int], *, max_bytes: int = 16) -> tuple[Portal, list[LogMark]]:
    portal, marks = Portal(), []
    shipper = LogShipper(portal.emit, marks.append, max_bytes=max_bytes)
    at = 0
    for size in reads:
        shipper.feed(data[at : at + size])
        at += size
    shipper.feed(data[at:])
    shipper.close()
    return portal, marks


def test_chunks_are_byte_ranges_cut_on_character_boundaries() -> None:
    data = "aé€😀b".encode()  # 1, 2, 3 and 4 bytes
    portal, marks = ship(data, [2, 1, 1, 3], max_bytes=4)
    assert portal.text() == "aé€😀b"
    assert all(len(text.encode()) <= 4 for text in portal.chunks.values())
    assert [(m.start, m.end) for m in marks] == [(0, 1), (1, 3), (3, 6), (6, 10), (10, 11)]


def test_invalid_bytes_become_replacement_characters_within_the_bound() -> None:
    data = b"\xff" * 10 + b"ok"
    portal, marks = ship(data, [], max_bytes=9)
    assert portal.text() == "\ufffd" * 10 + "ok"
    assert all(len(text.encode()) <= 9 for text in portal.chunks.values())
    assert marks[-1].end == len(data)


def test_an_unfinished_character_at_the_end_is_replaced_only_when_the_output_ends() -> None:
    portal = Portal()
    shipper = LogShipper(portal.emit)
    shipper.feed(b"x\xe2\x82")
    assert portal.chunks == {0: "x"}  # the euro sign's first two bytes wait
    shipper.close()
    assert portal.chunks == {0: "x", 1: "\ufffd"}


def test_a_full_outbox_drops_the_rest_and_says_how_much() -> None:
    kept: dict[int, str] = {}

    def emit(seq: int, text: str) -> bool:
        if "[agent]" not in text and sum(len(t) for t in kept.values()) + len(text) > 8:
            return False  # the outbox's bound, with room for the note
        kept[seq] = text
        return True

    shipper = LogShipper(emit, max_bytes=4)
    shipper.feed(b"abcdefghijkl")
    shipper.close()
    assert kept[0] + kept[1] == "abcdefgh"
    assert "4 bytes of output dropped" in kept[2]


def test_resume_from_a_note_repeats_the_note() -> None:
    portal = Portal()
    portal.emit(0, "[agent] a note\n")
    again = LogShipper(portal.emit)
    again.resume(LogMark(seq=0, start=0, end=0, note="[agent] a note\n"))
    again.feed(b"output\n")
    again.close()
    assert portal.text() == "[agent] a note\noutput\n"


@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60),
    reads=st.lists(st.integers(min_value=0, max_value=9), max_size=12),
    crash_after=st.integers(min_value=0, max_value=40),
    sent=st.booleans(),
)
def test_a_restart_after_any_mark_loses_no_byte_and_repeats_none(
    text: str, reads: list[int], crash_after: int, sent: bool
) -> None:
    data = text.encode()
    portal, marks = Portal(), []

    class Killed(Exception):
        pass

    def emit(seq: int, chunk: str) -> bool:
        return portal.emit(seq, chunk)

    def mark(m: LogMark) -> None:
        marks.append(m)
        if len(marks) > crash_after:
            if sent:  # killed after the chunk reached the outbox, before the next mark
                portal.emit(m.seq, chunk_of(m))
            raise Killed

    def chunk_of(m: LogMark) -> str:
        if m.note is not None:
            return m.note
        return decode_prefix(data[m.start : m.end], final=True)[0]

    first = LogShipper(emit, mark, max_bytes=8)
    at = 0
    try:
        first.note("[n]\n")
        for size in reads:
            first.feed(data[at : at + size])
            at += size
        first.feed(data[at:])
        first.close()
        return  # no crash in this example: nothing to resume
    except Killed:
        pass
    # The restarted agent: the same output, read from its last mark on.
    last = marks[-1]
    again = LogShipper(portal.emit, max_bytes=8)
    again.resume(last)
    again.feed(data[again.offset :])
    again.close()
    assert portal.text() == "[n]\n" + text
    assert all(len(chunk.encode()) <= 8 for chunk in portal.chunks.values())
