"""Text an operator tool writes to a terminal from what it did not write itself."""

from __future__ import annotations


def printable(value: object) -> str:
    """``value`` as text a terminal shows and never obeys: control characters (an
    escape sequence's ESC, a carriage return) and format characters (a bidirectional
    override) written as escapes. For what an operator tool shows that it did not write:
    what the gateway's snapshot carries (replica ids, route reasons, a replica's last
    error, which may quote its error body), what the admin endpoint answers, and what a
    capture log holds (``kvgate audit``)."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else
                   f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"
                   for ch in text)
