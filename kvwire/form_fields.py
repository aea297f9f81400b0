"""One text field of a ``multipart/form-data`` body (RFC 7578), read without parsing the
rest: an audio upload's ``model`` is all the gateway needs of it to pick a replica, and
the file part it carries (megabytes) is skipped by searching for the next delimiter.

The field is the last part whose ``Content-Disposition`` names it, as Starlette's form
(vLLM's server) reads a name given twice; its value is the part's bytes as UTF-8. A body
that is no form, or whose delimiters or part headers are broken, is a BadRequest naming
what is wrong; the replica would refuse it too.
"""

from __future__ import annotations

from kvwire.openai_schema import BadRequest

# a part's headers end within this many bytes of its delimiter (a browser's are ~100)
_HEADERS_MAX = 8192
FIELD_VALUE_MAX = 4096  # bytes of a field's value read; a longer one is refused
PARTS_MAX = 256  # parts looked at for the field (an upload has a handful); more are refused


def boundary_of(content_type: str | None) -> bytes:
    """The ``boundary`` parameter of a ``multipart/form-data`` content type."""
    given = content_type or ""
    kind, _, params = given.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise BadRequest(f"the body must be multipart/form-data (an upload), got content "
                         f"type {given[:80]!r}",
                         code="invalid_content_type")
    for param in params.split(";"):
        key, _, value = param.strip().partition("=")
        if key.strip().lower() == "boundary":
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if 0 < len(value) <= 70 and value.isascii():  # RFC 2046's bound
                return value.encode("ascii")
            break
    raise BadRequest(f"the multipart/form-data content type {given[:120]!r} names no "
                     f"usable boundary (1 to 70 ASCII characters)",
                     code="invalid_content_type")


def _field_name(headers: bytes) -> str | None:
    """The ``name`` of a part's ``Content-Disposition: form-data`` header, if any."""
    for line in headers.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() != b"content-disposition":
            continue
        for param in value.decode("latin-1").split(";")[1:]:
            pkey, _, pvalue = param.strip().partition("=")
            if pkey.strip().lower() == "name":
                pvalue = pvalue.strip()
                if len(pvalue) >= 2 and pvalue[0] == pvalue[-1] == '"':
                    pvalue = pvalue[1:-1]
                return pvalue
        return None
    return None


def form_field(content_type: str | None, body: bytes, name: str) -> str | None:
    """The value of ``body``'s field ``name`` (None when no part names it)."""
    boundary = boundary_of(content_type)
    opening = b"--" + boundary
    delimiter = b"\r\n" + opening
    if body.startswith(opening):
        at = len(opening)
    else:
        at = body.find(delimiter)
        if at < 0:
            raise BadRequest(f"the multipart body holds no part: its boundary {boundary!r} "
                             f"never comes", code="invalid_multipart")
        at += len(delimiter)
    found: bytes | None = None
    for _ in range(PARTS_MAX):
        if body.startswith(b"--", at):  # the closing delimiter
            return None if found is None else _text(found, name)
        start = body.find(b"\r\n", at, at + 1024)  # the delimiter line's end
        end = body.find(b"\r\n\r\n", start, start + _HEADERS_MAX) if start >= 0 else -1
        if end < 0:
            raise BadRequest(f"a part of the multipart body has no end of headers within "
                             f"{_HEADERS_MAX} bytes of its delimiter (byte {at})",
                             code="invalid_multipart")
        content = end + 4
        stop = body.find(delimiter, content)
        if stop < 0:
            raise BadRequest(f"the multipart body's part at byte {at} has no closing "
                             f"delimiter: the body was cut", code="invalid_multipart")
        if _field_name(body[start + 2:end + 2]) == name:
            found = body[content:stop]
            if len(found) > FIELD_VALUE_MAX:
                raise BadRequest(f"the form field {name!r} is {len(found)} bytes long "
                                 f"(at most {FIELD_VALUE_MAX})", param=name,
                                 code="invalid_multipart")
        at = stop + len(delimiter)
    raise BadRequest(f"the multipart body has more than {PARTS_MAX} parts",
                     code="invalid_multipart")


def _text(value: bytes, name: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest(f"the form field {name!r} is not UTF-8 text: {value[:40]!r}",
                         param=name, code="invalid_multipart") from None
