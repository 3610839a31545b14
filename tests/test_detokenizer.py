"""Streaming text: multi-byte characters are never split, stop strings never leak.

Covers: daemon/detokenizer.py.
"""
from daemon.detokenizer import IncrementalDetokenizer


class ByteTokenizer:
    """One token per UTF-8 byte: the worst case for incremental decoding."""

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


def stream(text: str, stop=None) -> tuple[list[str], IncrementalDetokenizer]:
    detok = IncrementalDetokenizer(ByteTokenizer(), stop)
    pieces = [detok.add(b) for b in text.encode()]
    pieces.append(detok.flush())
    return pieces, detok


def test_multibyte_characters_arrive_whole():
    pieces, _ = stream("naïve café — 東京 🚀")
    assert "".join(pieces) == "naïve café — 東京 🚀"
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_ends_the_text_before_it():
    pieces, detok = stream("hello world. bye", stop=["world"])
    assert "".join(pieces) == "hello "
    assert detok.stopped


def test_earliest_of_several_stop_strings_wins():
    pieces, _ = stream("one two three", stop=["three", "two"])
    assert "".join(pieces) == "one "


def test_partial_stop_string_is_released_when_it_does_not_complete():
    pieces, detok = stream("abcabd", stop=["abd!"])
    assert "".join(pieces) == "abcabd" and not detok.stopped
    assert pieces[-1] == "abd", "the possible stop prefix was held back until the end"
