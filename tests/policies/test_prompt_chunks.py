from zlib import crc32

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import prompt_chunks
from policies.prompt_chunks import ChunkMemo, text_chunks


@pytest.mark.parametrize("text", ["", "a", "plain ascii words " * 20, "naïve café " * 20,
                                  "ascii past whole runs of pieces " * 100, "x" * 2048,
                                  "混合 text with 漢字 " * 9, "\ud800 lone surrogate"])
def test_text_chunks_are_the_crc_of_each_chunk_of_characters(text: str) -> None:
    want = [crc32(text[i:i + 16].encode("utf-8", "surrogatepass"))
            for i in range(0, len(text), 16)]
    assert text_chunks(text, 16) == want


def test_text_chunks_name_a_bad_size() -> None:
    with pytest.raises(ValueError, match="0"):
        text_chunks("abc", 0)


# -- ChunkMemo: the hashes of a remembered text, reused where a new one starts the same --

_BASES = ["plain ascii words of a contract, clause by clause. " * 12,
          "naïve café au lait, crème brûlée; " * 16,
          "混合 text with 漢字 and more 文字 " * 14]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(range(len(_BASES))), st.integers(0, 600),
                          st.text(max_size=80), st.sampled_from(["", "tenant-b"])),
                min_size=1, max_size=12),
       st.sampled_from([1, 7, 16, 64]), st.integers(1, 6), st.integers(200, 4000))
def test_chunk_memo_always_answers_text_chunks(
        asks: list[tuple[int, int, str, str]], chars: int, max_texts: int,
        max_chars: int) -> None:
    # documents cut at any length, each with a question of its own (any characters, lone
    # surrogates included), in two groups, with the memo's bounds small enough to evict
    memo = ChunkMemo(chars, probe_chars=32, max_texts=max_texts, max_chars=max_chars)
    for base, cut, question, group in asks:
        text = _BASES[base][:cut] + question
        assert memo.chunks(text, group) == text_chunks(text, chars)
        assert len(memo) <= max_texts and memo.chars <= max_chars


def test_chunk_memo_hashes_only_what_follows_a_remembered_document() -> None:
    memo = ChunkMemo(16, probe_chars=64)
    document = _BASES[0]
    memo.chunks(document + " what is the term?")
    hashed: list[str] = []
    real = prompt_chunks.text_chunks

    def counting(text: str, chunk_chars: int) -> list[int]:
        hashed.append(text)
        return real(text, chunk_chars)

    prompt_chunks.text_chunks = counting
    try:
        asked = document + " and the fee?"
        assert memo.chunks(asked) == real(asked, 16)
    finally:
        prompt_chunks.text_chunks = real
    # only the pieces from the first one the two texts do not share
    assert hashed == [asked[len(document) // 16 * 16:]]
    assert memo.hits == 1


def test_chunk_memo_keeps_groups_apart() -> None:
    memo = ChunkMemo(16, probe_chars=64)
    text = _BASES[0] + " a question"
    memo.chunks(text, "tenant-a")
    memo.chunks(text + "?", "tenant-b")
    assert memo.hits == 0  # one tenant's text never serves another's
    memo.chunks(text + "!", "tenant-a")
    assert memo.hits == 1


def test_chunk_memo_keeps_no_short_or_huge_text() -> None:
    memo = ChunkMemo(16, probe_chars=64, max_chars=1000)
    memo.chunks("short text")  # under 2 x probe_chars: hashed, not kept
    memo.chunks("x" * 1001)  # over max_chars: hashed, not kept
    assert len(memo) == 0 and memo.chars == 0
    kept = _BASES[0][:600]
    memo.chunks(kept)
    memo.chunks("y" * 1001)  # ... and it does not push out what is kept
    assert len(memo) == 1 and memo.chars == 600


def test_chunk_memo_names_a_bad_size() -> None:
    with pytest.raises(ValueError, match="probe_chars must be >= 1, got 0"):
        ChunkMemo(16, probe_chars=0)
