"""Prefix-stability checks for prompt templates, for a project's own tests and CI.

A prefix cache only helps when requests start with the same token ids. Render two requests
that should share a prefix (two users' messages, two questions about one document) and
check that their first ``n_tokens`` tokens agree::

    from kvgate.layout import assert_shared_prefix

    def test_system_prompt_is_shared():
        assert_shared_prefix(render("What is the notice period?"),
                             render("Who pays for repairs?"), tokenizer, n_tokens=64)

``assert_shared_prefix`` fails with the first differing token and the text around it;
``prefix_fingerprint`` gives a stable id of a prompt's first ``n_tokens`` tokens, to pin
in a test or compare across releases. The implementation lives in
``kvwire.prompt_layout`` (the gateway's audit uses it too).
"""

from kvwire.prompt_layout import (
    ADVICE,
    SharedPrefixError,
    assert_shared_prefix,
    common_prefix_tokens,
    prefix_fingerprint,
)

__all__ = ["ADVICE", "SharedPrefixError", "assert_shared_prefix", "common_prefix_tokens",
           "prefix_fingerprint"]
