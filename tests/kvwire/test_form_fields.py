"""``form_field`` reads one text field of a multipart/form-data body as the clients that
upload audio build it (httpx, which the openai client uses), wherever the field comes,
and refuses a body that is no form or is cut, naming what is wrong."""

from __future__ import annotations

import httpx
import pytest

from kvwire.form_fields import FIELD_VALUE_MAX, PARTS_MAX, boundary_of, form_field
from kvwire.openai_schema import BadRequest

_AUDIO = bytes(range(256)) * 64 + b"\r\n--not-the-boundary\r\n\r\n"


def _form(data: dict[str, str], first: bool = False) -> tuple[str, bytes]:
    files = {"file": ("clip.wav", _AUDIO, "audio/wav")}
    request = httpx.Request("POST", "http://x/v1/audio/transcriptions", data=data,
                            files=files)
    content = request.read()
    if first:  # the file part ahead of the fields
        boundary = boundary_of(request.headers["content-type"])
        parts = content.split(b"--" + boundary)
        content = b"--" + boundary + (b"--" + boundary).join(
            [parts[-2], *parts[1:-2], parts[-1]])
    return request.headers["content-type"], content


@pytest.mark.parametrize("first", [False, True])
def test_a_field_is_read_wherever_it_comes(first: bool) -> None:
    content_type, body = _form({"model": "whisper-large-v3", "language": "en"}, first)
    assert form_field(content_type, body, "model") == "whisper-large-v3"
    assert form_field(content_type, body, "language") == "en"
    assert form_field(content_type, body, "prompt") is None


def test_a_name_given_twice_is_read_as_its_last_and_a_near_boundary_is_content() -> None:
    """As Starlette's form reads it (vLLM's server); a file holding the delimiter but for
    its last character is content, and a body that opens with a line break still has its
    first part."""
    content_type = "multipart/form-data; boundary=x--"
    near = b"\r\n--x-" + b"\r\n"
    body = (b"\r\n--x--\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nA\r\n"
            b"--x--\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\n" + near
            + b"\r\n--x--\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nB"
            b"\r\n--x----\r\n")
    assert form_field(content_type, body, "model") == "B"
    assert form_field(content_type, body, "file") == near.decode()
    assert form_field(content_type, body[2:], "model") == "B"


def test_a_quoted_boundary_a_preamble_and_unicode() -> None:
    body = (b"a preamble\r\n--b:1\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
            + "modèle".encode() + b"\r\n--b:1--\r\n")
    assert form_field('multipart/form-data; boundary="b:1"', body, "model") == "modèle"


@pytest.mark.parametrize(("content_type", "body", "named"), [
    ("application/json", b"{}", "application/json"),
    (None, b"", "''"),
    ("multipart/form-data", b"", "no usable boundary"),
    ("multipart/form-data; boundary=abc", b"--xyz\r\n\r\n", "never comes"),
    ("multipart/form-data; boundary=abc",
     b"--abc\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm", "was cut"),
    ("multipart/form-data; boundary=abc",
     b"--abc\r\nContent-Disposition: form-data; name=\"model\"" + b" " * 9000, "end of headers"),
    ("multipart/form-data; boundary=abc",
     b"--abc\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n\xff\r\n--abc--",
     "not UTF-8"),
    ("multipart/form-data; boundary=abc",
     b"--abc\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n"
     + b"m" * (FIELD_VALUE_MAX + 1) + b"\r\n--abc--", f"at most {FIELD_VALUE_MAX}"),
    ("multipart/form-data; boundary=abc",
     b"--abc\r\nContent-Disposition: form-data; name=\"x\"\r\n\r\ny\r\n" * (PARTS_MAX + 1)
     + b"--abc--", f"more than {PARTS_MAX} parts"),
])
def test_what_is_no_form_is_refused_naming_why(content_type: str | None, body: bytes,
                                               named: str) -> None:
    with pytest.raises(BadRequest) as caught:
        form_field(content_type, body, "model")
    assert named in caught.value.message, caught.value.message
