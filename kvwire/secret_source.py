"""Secrets (the gateway's admin token, tenancy key and replica keys, the engine's
``--api-key``) may be written in the config or on the command line, or kept out of it:
read from a file (a mounted Kubernetes Secret: a regular file, or a link to one, of at most
``MAX_SECRET_FILE_BYTES``) or from an environment variable. One
resolver for both servers, so that a file's trailing newline, an empty secret and a secret
no ``Authorization`` header can carry are read alike on both ends of the wire; and one
reading of the ``Authorization: Bearer`` header that presents it (:func:`bearer_token`), with
the errors refusing a missing or wrong API key, alike from both servers."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable

from kvwire.openai_schema import BadRequest, Unauthorized
from kvwire.regular_files import FileTooLarge, NotRegularFile, read_regular

MAX_SECRET_FILE_BYTES = 1 << 16


def resolve_secret(value: str | None, file: str | None, env: str | None,
                   name: str, labels: tuple[str, str, str] | None = None, *,
                   empty_refused: bool = False) -> str | None:
    """``value`` if set, else the stripped contents of ``file``, else the stripped value
    of the environment variable ``env`` (a Kubernetes Secret made from a file keeps its
    trailing newline, which no header can carry); None when none is configured or what
    it holds is empty.
    ValueError names ``name`` and the source that failed, or the sources when more than
    one is configured: one would win silently (a rotated file behind a value left in the
    YAML was never read). ``labels``: how errors name the three sources (a command's
    flags), by default ``name``, ``name_file`` and ``name_env`` (the config's keys).
    ``empty_refused`` (a command's flags, where giving one says a secret is wanted): a
    source given empty (``""``, a file or variable holding only whitespace) is configured
    all the same, and a ValueError naming it rather than no secret."""
    as_value, as_file, as_env = labels or (name, f"{name}_file", f"{name}_env")
    if not empty_refused:  # an empty value, file name or variable name: none configured
        value, file, env = value or None, file or None, env or None
    given = [label for label, source in ((as_value, value), (as_file, file), (as_env, env))
             if source is not None]
    if len(given) > 1:
        raise ValueError(f"{' and '.join(given)} are set: configure the {name} in one "
                         "place")
    if not given:
        return None
    secret = _read(value, file, env, as_file, as_env)
    if secret or not empty_refused:
        return secret or None
    where = f"{as_file} {file!r} holds no {name}" if file is not None else \
        f"{given[0]} is empty"
    raise ValueError(f"{where}: give the {name}, or none of {as_value}, {as_file} and "
                     f"{as_env} to have no {name}")


def _read(value: str | None, file: str | None, env: str | None, as_file: str,
          as_env: str) -> str:
    """The secret of the one source given (``value``, else ``file``, else ``env``),
    stripped when read from the file or the variable; ValueError naming the source that
    failed."""
    if value is not None:
        return value
    if file is not None:
        held = _read_file(file, as_file)
        if len(held) > MAX_SECRET_FILE_BYTES:  # (grown past it as it was read)
            raise _too_large(file, as_file)
        try:  # UTF-8 whatever the locale, as the value would be written in the YAML
            return held.decode().strip()
        except UnicodeDecodeError as exc:
            raise ValueError(f"{as_file} {file!r} is not UTF-8 text (byte {exc.start + 1} "
                             "of it): write the secret as text (openssl rand -hex 32)") \
                from None
    assert env is not None  # the one source given
    found = os.environ.get(env)
    if found is None:  # (a name not shown unless it looks like one: a secret written in
        # its place would be)
        named = repr(env) if _ENV_NAME.fullmatch(env) else _unshown(env, "a name")
        raise ValueError(f"{as_env} {named} is not set")
    return found.strip()


# what a variable's name is written like, and a key (hex, base64, "sk-...") is not: upper
# case letters, digits and underscores, up to 48 of them
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,47}")


def _unshown(source: str, kind: str) -> str:
    """A file name or variable name an error does not show, as it names it: a secret
    written in its place (``token_env: sk-...``) would be printed whole."""
    return f"({kind} of {len(source):,} characters, not shown in case it is the secret)"


def _too_large(file: str, as_file: str) -> ValueError:
    return ValueError(f"{as_file} {file!r} holds over {MAX_SECRET_FILE_BYTES} bytes: not a "
                      "secret")


def _read_file(file: str, as_file: str) -> bytes:
    """At most ``MAX_SECRET_FILE_BYTES`` + 1 bytes of ``file`` (a path to a log by mistake
    is named, not read to its end), which must be a regular file (``read_regular``); a
    FIFO, a device or a directory is refused without being read. ValueError naming
    ``as_file`` and the path."""
    try:
        return read_regular(file, MAX_SECRET_FILE_BYTES)
    except NotRegularFile as exc:
        raise ValueError(f"{as_file} {file!r} is {exc.kind}, not a regular file: give the "
                         "path of a file that holds the secret") from None
    except FileTooLarge:
        raise _too_large(file, as_file) from None
    except OSError as exc:  # a path that names nothing may be a secret written in its place
        named = repr(file) if os.path.lexists(file) else _unshown(file, "a path")
        raise ValueError(f"{as_file} {named}: {exc.strerror}") from None


def file_stamp(file: str) -> tuple[int, int, int, int]:
    """What tells that a secret file was rewritten or replaced since it was read: its
    device, inode, size and modification time, through links (a mounted Kubernetes Secret
    is updated by pointing a link at a new file). OSError as ``os.stat`` raises it."""
    st = os.stat(file)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def exposed_file_warning(path: str, label: str) -> str | None:
    """A one-line warning when the secret file ``path`` (given as ``label``) may be read or
    written by users other than its owner, else None (also when it cannot be read: its
    resolver names that). Warned of: read or write by others, and group write; group read
    only where this process owns the file (where it does not, group read may be how it
    reads it: a Kubernetes Secret mounted with ``fsGroup``)."""
    try:
        info = os.stat(path)  # (a link's target: a mounted Secret is a link to its file)
    except OSError:
        return None
    mode = stat.S_IMODE(info.st_mode)
    exposed = stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP
    if info.st_uid == os.geteuid():
        exposed |= stat.S_IRGRP
    if not mode & exposed:
        return None
    return (f"{label} {path!r} has permissions {mode:04o}: users other than its owner may "
            "read or write the secret in it; chmod 600 it (640 where the process reads it as "
            "its group)")


def resolve_bearer(value: str | None, file: str | None, env: str | None, name: str,
                   named: str, min_chars: int = 0,
                   labels: tuple[str, str, str] | None = None, *,
                   empty_refused: bool = False) -> str | None:
    """``resolve_secret`` (``labels`` and ``empty_refused`` as there), for a secret
    presented as ``Authorization: Bearer <secret>`` (an admin token, a client's API key, a
    replica's key, the engine's ``--api-key``), checked at every read (a file or variable
    read again may have changed since the config was validated): ValueError naming
    ``named`` for one shorter than ``min_chars`` or one no header can carry
    (``check_bearer``)."""
    secret = resolve_secret(value, file, env, name, labels, empty_refused=empty_refused)
    if secret is None:
        return None
    if len(secret) < min_chars:
        raise ValueError(f"{named} must be at least {min_chars} characters, got "
                         f"{len(secret)}")
    check_bearer(secret, named)
    return secret


def check_bearer(value: str, name: str) -> None:
    """ValueError naming ``name`` (never the value) unless ``value`` can be presented as
    written in an ``Authorization: Bearer`` header: an HTTP server strips the spaces around
    a header's value, refuses control characters and reads the bytes as Latin-1 (a client
    writes UTF-8), so a secret with any of those matched no request; every call was
    refused 401."""
    if value != value.strip(" \t"):
        raise ValueError(f"{name} starts or ends with a space or tab, which no HTTP header "
                         "carries; remove it")
    for i, char in enumerate(value):
        if not " " <= char <= "~" and char != "\t":
            kind = "a control character" if char < " " or char == "\x7f" else \
                "a non-ASCII character"
            raise ValueError(f"{name} holds {kind} (character {i + 1} of {len(value)}), "
                             "which an Authorization header cannot carry as written; use "
                             "printable ASCII")


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes:
    """The token of the one ``Authorization: Bearer <token>`` among a request's raw (ASGI)
    ``headers`` (the scheme in any case, as RFC 9110 reads it), stripped; b"" when there is
    none (no header, another scheme, no token). BadRequest when the header came more than
    once (one field, RFC 9110): which one a proxy in front read is not known, and a key
    may name a tenant."""
    values = [value for name, value in headers if name == b"authorization"]
    if not values:
        return b""
    if len(values) > 1:
        raise BadRequest(f"header 'authorization' was sent {len(values)} times; send it once",
                         code="repeated_authorization")
    scheme, _, token = values[0].partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


def missing_api_key() -> Unauthorized:
    """The refusal of a request that presents no API key (``bearer_token`` found none)."""
    return Unauthorized("an API key is required: 'Authorization: Bearer <key>'",
                        code="missing_api_key")


def invalid_api_key() -> Unauthorized:
    """The refusal of a request whose API key is not one the server takes."""
    return Unauthorized("the API key is not valid", code="invalid_api_key")
