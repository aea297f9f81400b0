"""Media chat parts: checked, and replaced by placeholders that follow their content."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from kvwire.chat_messages import ChatFormatError, normalize_messages
from kvwire.media_parts import carries_media
from kvwire.openai_schema import BadRequest, parse_fields
from kvwire.tokenizer import load_tokenizer


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def audio(data: str, fmt: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "You describe pictures."},
            {"role": "user", "content": [{"type": "text", "text": "Look: "}, *parts,
                                         {"type": "text", "text": " What is it?"}]}]


def content(messages: list[dict[str, Any]], hash_media: bool = True) -> str:
    return normalize_messages(messages, hash_media)[1]["content"]


PNG_A = "data:image/png;base64," + base64.b64encode(b"\x89PNG picture A" * 50).decode()
PNG_B = "data:image/png;base64," + base64.b64encode(b"\x89PNG picture B" * 50).decode()


def test_a_media_part_stands_where_it_was_by_its_content() -> None:
    a = content(user(image(PNG_A)))
    assert a.startswith("Look: <|image:") and a.endswith("|> What is it?")
    assert content(user(image(PNG_A))) == a  # the same picture, the same placeholder
    assert content(user(image(PNG_B))) != a
    assert content(user(image("https://example.com/a.png"))) != a
    # audio keys on its data and its format
    wav = content(user(audio("UklGRg==")))
    assert "<|audio:" in wav
    assert content(user(audio("UklGRg==", "mp3"))) != wav
    assert content(user(audio("UklGRh=="))) != wav
    video = content(user({"type": "video_url", "video_url": {"url": "https://x/v.mp4"}}))
    assert "<|video:" in video


def test_checking_without_hashing_keeps_the_length() -> None:
    hashed = content(user(image(PNG_A), audio("UklGRg==")))
    checked = content(user(image(PNG_A), audio("UklGRg==")), hash_media=False)
    assert len(hashed) == len(checked) and hashed != checked
    assert "<|image:" + "0" * 32 + "|>" in checked


@pytest.mark.parametrize(("part", "field"), [
    ({"type": "image_url"}, "messages[1].content[1].image_url"),
    ({"type": "image_url", "image_url": "https://x/a.png"}, "messages[1].content[1].image_url"),
    ({"type": "image_url", "image_url": {}}, "messages[1].content[1].image_url.url"),
    ({"type": "image_url", "image_url": {"url": 7}}, "messages[1].content[1].image_url.url"),
    ({"type": "image_url", "image_url": {"url": "ftp://x/a.png"}},
     "messages[1].content[1].image_url.url"),
    ({"type": "input_audio", "input_audio": {"format": "wav"}},
     "messages[1].content[1].input_audio.data"),
    ({"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": ""}},
     "messages[1].content[1].input_audio.format"),
    ({"type": "video_url", "video_url": {"url": None}}, "messages[1].content[1].video_url.url"),
    ({"type": "hologram", "hologram": {}}, "messages[1].content[1]"),
    ({"type": ["image_url"]}, "messages[1].content[1]"),
])
def test_a_malformed_part_is_named(part: dict[str, Any], field: str) -> None:
    with pytest.raises(ChatFormatError) as raised:
        normalize_messages(user(part))
    assert raised.value.param == field
    assert str(raised.value).startswith(field + " ")
    body = {"model": "m", "messages": user(part)}
    with pytest.raises(BadRequest) as bad:
        parse_fields(body, chat=True)
    assert bad.value.param == field and bad.value.status == 400


def test_a_big_image_costs_a_few_tokens_and_no_tokenizing() -> None:
    tokenizer = load_tokenizer()
    big = "data:image/png;base64," + base64.b64encode(os.urandom(3 << 20)).decode()
    text = tokenizer.render_chat(user(image(big)))
    assert len(text) < 200
    assert len(tokenizer.encode(text)) < 120


def test_carries_media() -> None:
    assert carries_media(user(image(PNG_A)))
    assert not carries_media([{"role": "user", "content": [{"type": "text", "text": "x"}]}])
    assert not carries_media([{"role": "user", "content": "x"}, "junk"])
    assert not carries_media(None)


def test_every_part_vllm_reads_is_read() -> None:
    # what vLLM's chat parser takes must not be refused before a replica sees it
    bare: Any = "plain string part "
    assert content(user(bare)).startswith("Look: plain string part ")
    assert "I can't help." in content(user({"type": "refusal", "refusal": "I can't help."}))
    assert "hmm" in content(user({"type": "thinking", "thinking": "hmm"}))
    # a part without ``type`` that carries its URL as a string stands as the typed one
    assert content(user({"image_url": PNG_A})) == content(user(image(PNG_A)))
    assert content(user({"text": "bare"})) == "Look: bare What is it?"
    for part in ({"type": "audio_url", "audio_url": {"url": "https://x/a.wav"}},
                 {"type": "image_embeds", "image_embeds": "QUJD"},
                 image("file:///data/pictures/a.png")):
        text = content(user(part))
        assert "<|" in text and carries_media(user(part))
        assert parse_fields({"model": "m", "messages": user(part)}, chat=True).messages
    assert carries_media(user({"image_url": PNG_A}))
    assert not carries_media(user({"type": "refusal", "refusal": "no"}))
