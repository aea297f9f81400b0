from zlib import crc32

import pytest

from policies.prompt_chunks import text_chunks


@pytest.mark.parametrize("text", ["", "a", "plain ascii words " * 20, "naïve café " * 20,
                                  "混合 text with 漢字 " * 9, "\ud800 lone surrogate"])
def test_text_chunks_are_the_crc_of_each_chunk_of_characters(text: str) -> None:
    want = [crc32(text[i:i + 16].encode("utf-8", "surrogatepass"))
            for i in range(0, len(text), 16)]
    assert text_chunks(text, 16) == want


def test_text_chunks_name_a_bad_size() -> None:
    with pytest.raises(ValueError, match="0"):
        text_chunks("abc", 0)
