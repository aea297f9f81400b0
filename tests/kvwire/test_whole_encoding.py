import random

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvwire.tokenizer import load_tokenizer
from kvwire.tokenizer_build import sample_text
from kvwire.whole_encoding import CHECKS, MARK, WholeEncodings, cuts, space_cut


def test_cuts_sit_right_before_a_space_and_depend_only_on_the_text_before_them() -> None:
    text = sample_text(random.Random(1), 900)
    at = cuts(text)
    assert at and all(text[c] == " " for c in at) and at == sorted(set(at))
    longer = text + " and more words" * 300
    assert cuts(longer)[: len(at) - 1] == at[:-1]  # the last may move: its mark is near the end


def test_documents_and_growing_chats_reuse_their_prefix_and_encode_exactly() -> None:
    tok = load_tokenizer(None, memo_size=64)
    assert tok.whole is not None
    rng = random.Random(2)
    docs = [sample_text(rng, 1200) for _ in range(3)]
    texts = [f"{docs[i % 3]}\n\nQuestion: {sample_text(rng, 30)}" for i in range(30)]
    chat = ""
    for _ in range(8):  # each turn repeats the ones before it
        chat += f"<|im_start|>user\n{sample_text(rng, 200)}<|im_end|>\n"
        texts.append(chat)
    for text in texts:
        assert tok.encode_prefix(text, None).ids == tok.encode(text)
    assert tok.whole.reuse and tok.whole.checked == CHECKS
    assert tok.whole.hits >= 27 + 5


def test_a_tenant_never_reuses_another_tenants_prefix() -> None:
    tok = load_tokenizer(None, memo_size=64)
    assert tok.whole is not None
    text = sample_text(random.Random(3), 1500)
    tok.encode_prefix(text + " one", None, group="a")
    tok.encode_prefix(text + " two", None, group="b")
    assert tok.whole.hits == 0
    tok.encode_prefix(text + " three", None, group="a")
    assert tok.whole.hits == 1


def test_a_tokenizer_that_splits_otherwise_turns_reuse_off() -> None:
    def encode(text: str) -> list[int]:
        # a tokenizer whose first token depends on the whole text: no split is exact
        return [len(text), *map(ord, text)]

    whole = WholeEncodings(encode)
    text = "word " * (3 * MARK // 5)
    assert whole.encode(text) == encode(text)  # split, checked, differs
    assert not whole.reuse
    assert whole.encode(text + "y") == encode(text + "y")


def test_the_memo_holds_at_most_its_capacity() -> None:
    tok = load_tokenizer(None, memo_size=16)
    assert tok.whole is not None
    rng = random.Random(4)
    for _ in range(20):
        tok.encode_prefix(sample_text(rng, 800), None)
    assert len(tok.whole._memo) == 4


def _merged_space_tokenizer() -> Tokenizer:
    """A byte-level BPE that has learned runs of spaces (code indentation) and ``"  \\n"``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(6)
    corpus = [_code(rng, 60) for _ in range(40)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def _code(rng: random.Random, lines: int) -> str:
    """Indented lines, some ending in a markdown hard break (two spaces, newline)."""
    out = []
    for _ in range(lines):
        indent = " " * rng.choice((0, 4, 8, 12, 16, 24))
        words = " ".join(rng.choice(("return", "x", "value", "if", "for", "y"))
                         for _ in range(rng.randint(1, 6)))
        out.append(indent + words + ("  " if rng.random() < 0.3 else ""))
    return "\n".join(out) + "\n"


def test_a_cut_is_the_last_space_after_a_non_space() -> None:
    assert space_cut("ab  cd", 0, 6) == 2  # before the run of spaces, not inside it
    assert space_cut("ab cd  \nef", 0, 10) == 5  # before "  \n", not inside it
    assert space_cut("   ab", 0, 5) == -1 and space_cut("abc", 0, 3) == -1


def test_a_cut_never_splits_a_run_of_whitespace() -> None:
    tok = _merged_space_tokenizer()
    assert any(t.startswith("ĠĠ") for t in tok.get_vocab())  # it did learn merged spaces

    def encode(text: str) -> list[int]:
        return list(tok.encode(text).ids)

    whole = WholeEncodings(encode)
    whole.checked = CHECKS  # the split encodings are trusted: each is compared here
    rng = random.Random(7)
    for _ in range(12):
        text = _code(rng, 400)
        for cut in cuts(text):
            assert text[cut] == " " and not text[cut - 1].isspace()
        assert whole.encode(text) == encode(text)  # a miss, split once
        assert whole.encode(text + "more") == encode(text + "more")  # a hit
    assert whole.reuse and whole.hits == 12


def test_a_long_text_without_spaces_is_encoded_whole() -> None:
    tok = load_tokenizer(None, memo_size=64)
    assert tok.whole is not None
    for text in ("x" * 3000, "中文" * 1500, "a\u3000b" * 900):
        assert cuts(text) == []
        assert tok.encode_prefix(text, None).ids == tok.encode(text)
    assert tok.whole.reuse
