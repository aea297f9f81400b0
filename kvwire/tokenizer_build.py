"""Build the project's own small byte-level BPE tokenizer, deterministically.

Nothing is downloaded: the training text is generated from a fixed word list (pseudo-English
words made from syllables, plus common English function words) with a fixed seed, so the
same ``tokenizer.json`` comes out on every machine. The shipped copy lives in
``kvwire/assets/tokenizer/``; ``python -m kvwire.tokenizer_build --check`` rebuilds it and
compares.

Usage::

    python -m kvwire.tokenizer_build [--out DIR] [--check]
    python -m kvwire.tokenizer_build --out DIR --vocab-size 16000

Another ``--vocab-size`` gives another tokenizer of the same text, one that counts other
tokens than the gateway's: what replicas with their own tokenizer look like (a fleet
test's engines can load it with ``--tokenizer DIR``).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from collections.abc import Iterator
from pathlib import Path

ASSET_DIR = Path(__file__).parent / "assets" / "tokenizer"
VOCAB_SIZE = 4096
EOS_TOKEN = "<|endoftext|>"
SPECIAL_TOKENS = (EOS_TOKEN, "<|im_start|>", "<|im_end|>")

_FUNCTION_WORDS = (  # noqa: SIM905 - a sentence is easier to read and edit than a list
    "the of and to a in that is for it as with was on be by this are or at from an "
    "which not have has but all any each shall may will must such other than party "
    "parties agreement contract section clause term notice date law upon under within "
    "without where when who whom what if then there these those its their his her we "
    "you they our your it been being into over after before between during against"
).split()
_ONSETS = ("b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "br", "cl", "cr", "dr", "fl", "gr", "pl", "pr", "st", "str", "th", "tr", "sh", "ch")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou", "ee")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "nt", "st", "ck", "ng", "rt")
_SUFFIXES = ("", "", "", "s", "ed", "ing", "tion", "ment", "able", "ly", "er", "ity")


def _make_words(count: int = 6000, seed: int = 20261129) -> tuple[str, ...]:
    rng = random.Random(seed)
    words: list[str] = list(_FUNCTION_WORDS)
    seen = set(words)
    while len(words) < count:
        syllables = rng.choice((1, 2, 2, 3, 3, 4))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(syllables)
        ) + rng.choice(_SUFFIXES)
        if word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


WORDS: tuple[str, ...] = _make_words()
"""The word list shared by the tokenizer's training text and the load-test workloads."""


def sample_text(rng: random.Random, num_words: int) -> str:
    """Text of ``num_words`` words with a Zipf-like word frequency and sentence punctuation."""
    n = len(WORDS)
    out: list[str] = []
    for i in range(num_words):
        # Zipf-ish rank: small ranks (function words) are far more frequent.
        rank = min(int(n ** rng.random()) - 1, n - 1)
        word = WORDS[rank]
        if i % 17 == 16:
            word += "."
        elif i % 11 == 10:
            word += ","
        out.append(word)
    return " ".join(out)


def corpus(lines: int = 4000, seed: int = 7) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(lines):
        yield sample_text(rng, 60)
    yield from WORDS  # every word at least once, so every word has a short encoding
    yield "0 1 2 3 4 5 6 7 8 9 10 100 1000 2026 (a) (b) (c) \"quoted\" 'single' - ; : ? ! %"


def build(out_dir: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train the tokenizer and write ``out_dir/tokenizer.json``; returns its path."""
    if vocab_size < 512:
        raise ValueError(f"vocab_size must be >= 512 (the byte alphabet and specials), "
                         f"got {vocab_size!r}")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    tokenizer.save(str(path), pretty=False)
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSET_DIR)
    parser.add_argument("--check", action="store_true",
                        help="rebuild into a temporary folder and compare with the shipped copy")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE,
                        help="another size makes another tokenizer (not with --check)")
    args = parser.parse_args(argv)
    if args.check and args.vocab_size != VOCAB_SIZE:
        parser.error("--check compares the shipped tokenizer: leave --vocab-size out")
    if args.vocab_size != VOCAB_SIZE and args.out.resolve() == ASSET_DIR.resolve():
        parser.error(f"--vocab-size {args.vocab_size} would replace the shipped tokenizer: "
                     "give --out")
    if args.check:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            built = build(Path(tmp))
            same = digest(built) == digest(ASSET_DIR / "tokenizer.json")
        print("identical" if same else "DIFFERENT")
        return 0 if same else 1
    path = build(args.out, args.vocab_size)
    print(f"wrote {path} sha256={digest(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
