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
    assert a.startswith("Look: \n<|image:") and a.endswith("|>\n What is it?")
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
    assert content(user(bare)).startswith("Look: \nplain string part \n")
    assert "I can't help." in content(user({"type": "refusal", "refusal": "I can't help."}))
    assert "hmm" in content(user({"type": "thinking", "thinking": "hmm"}))
    # a part without ``type`` that carries its URL as a string stands as the typed one
    assert content(user({"image_url": PNG_A})) == content(user(image(PNG_A)))
    assert content(user({"text": "bare"})) == "Look: \nbare\n What is it?"
    for part in ({"type": "audio_url", "audio_url": {"url": "https://x/a.wav"}},
                 {"type": "image_embeds", "image_embeds": "QUJD"},
                 image("file:///data/pictures/a.png")):
        text = content(user(part))
        assert "<|" in text and carries_media(user(part))
        assert parse_fields({"model": "m", "messages": user(part)}, chat=True).messages
    assert carries_media(user({"image_url": PNG_A}))
    assert not carries_media(user({"type": "refusal", "refusal": "no"}))


def test_parts_only_a_replica_can_read_stand_in_by_a_digest_of_the_whole_part() -> None:
    # the gateway forwards them (vLLM reads them); the engine, which must serve what it
    # reads, refuses them
    def chat(*parts: object) -> list[dict[str, object]]:
        return [{"role": "user", "content": [*parts, {"type": "text", "text": "and?"}]}]

    unknown = {"type": "input_image", "image_url": "https://example.com/a.png"}
    by_uuid = {"type": "image_url", "uuid": "cached-7"}
    for part in (unknown, by_uuid):
        with pytest.raises(ChatFormatError):
            normalize_messages(chat(part))
        (once,) = normalize_messages(chat(part), lenient=True)
        (again,) = normalize_messages(chat(dict(reversed(list(part.items())))), lenient=True)
        assert once["content"].startswith("<|part:") and once["content"].endswith("and?")
        assert once == again  # the part's keys in any order
    (one,) = normalize_messages(chat(unknown), lenient=True)
    (other,) = normalize_messages(chat({**unknown, "image_url": "https://example.com/b.png"}),
                                  lenient=True)
    assert one != other
    (checked,) = normalize_messages(chat(unknown), hash_media=False, lenient=True)
    assert checked["content"] == "<|part:" + "0" * 32 + "|>\nand?"
    with pytest.raises(ChatFormatError, match="url"):  # malformed: refused either way
        normalize_messages(chat({"type": "image_url", "image_url": {"url": ""}}),
                           lenient=True)
    # a text part whose text is null reads as empty, as vLLM skips it
    (skipped,) = normalize_messages(chat({"type": "text", "text": None}))
    assert skipped["content"] == "and?"


def test_prompt_embeds_stand_for_the_prompt_where_the_replica_judges_them() -> None:
    body = {"model": "m", "prompt_embeds": "AAAAPw=="}
    with pytest.raises(BadRequest, match="'prompt_embeds' is not supported"):
        parse_fields(body, chat=False)
    fields = parse_fields(body, chat=False, lenient=True)
    assert fields.prompt_text is not None and fields.prompt_text.startswith("<|embeds:")
    assert parse_fields({**body, "prompt_embeds": ["AAAAPw==", "AAAAQA=="]}, chat=False,
                        lenient=True).num_prompts == 2
    with pytest.raises(BadRequest, match="prompt_embeds"):
        parse_fields({**body, "prompt_embeds": 7}, chat=False, lenient=True)


def test_image_embeds_given_as_an_object_of_any_depth_stand_by_their_content() -> None:
    # an object's values were written with str(), which overflowed the stack on one
    # nested 1,000 levels deep (JSON allows 1,024): a 500 from the gateway and the engine
    from kvwire.openai_schema import decode_json

    def embeds(value: bytes) -> list[dict[str, Any]]:
        return decode_json(b'[{"role": "user", "content": [{"type": "image_embeds", '
                           b'"image_embeds": ' + value + b'}, "What is it?"]}]')

    deep = b"[" * 1010 + b"1" + b"]" * 1010
    for value in (b'{"pixel_values": ' + deep + b', "grid": "AAA="}', b'{"a": "QUJD"}'):
        (message,) = normalize_messages(embeds(value))
        assert message["content"].startswith("<|image:")
        assert parse_fields({"messages": embeds(value)}, chat=True).messages
    system = {"role": "system", "content": "You describe pictures."}
    assert content([system, *embeds(b'{"a": "QUJD", "b": [1, 2]}')]) == \
        content([system, *embeds(b'{"b": [1, 2], "a": "QUJD"}')])
    assert content([system, *embeds(b'{"a": "QUJD"}')]) != \
        content([system, *embeds(b'{"a": "QUJE"}')])
