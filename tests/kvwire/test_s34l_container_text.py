"""A container a chat template turns into text (``~``, ``string``, ``pprint``, ``join``,
``%``, an output) is measured by its text, each item as often as it is referenced, and a
``slice`` by its count: refused before it is built once past the bound. Measured with a
small bound, so that a template that is not refused builds a few thousand characters."""

from __future__ import annotations

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvwire import chat_template
from kvwire.chat_template import TemplateBuildTooLong, compile_template, render

BOUND = 1000

BUILDS = {
    "concat": "{{ ('' ~ ([s] * 10)) | length }}",
    "string": "{{ ([s] * 10) | string | length }}",
    "join-nested": "{{ [[s] * 10] | join | length }}",
    "pprint": "{{ ([s] * 10) | pprint | length }}",
    "pprint-nested-dict": "{{ {s: {s: [s] * 3}} | pprint | length }}",
    # short as text, but each item's line indented past the key: counted as written
    "pprint-indented": "{{ {s: ['a'] * 10} | pprint | length }}",
    "percent": "{{ ('%s' % ([s] * 10,)) | length }}",
    "output": "{{ [s] * 10 }}",
    "output-dict": "{{ {'a': [s] * 5, 'b': [s] * 5} }}",
    "output-namespace": "{% set ns = namespace(a=[s] * 10) %}{{ ns }}",
    "slice": "{{ [1] | slice(2000) | list | length }}",
}


@pytest.fixture
def small_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_template, "MAX_RENDERED_CHARS", BOUND)


@pytest.mark.parametrize("source", BUILDS.values(), ids=BUILDS.keys())
def test_a_container_turned_into_text_past_the_bound_is_refused(
        small_bound: None, source: str) -> None:
    template = compile_template(source, "tiny").template
    with pytest.raises(TemplateBuildTooLong, match="tiny builds a value of ~"):
        render(template, {"s": "x" * 200})


SHORT = ("{{ [1, 'a', none, 2.5] }}|{{ {'k': [1, 2], 'j': 'v'} }}|{{ ('x', 3) }}|"
         "{{ [1, 2] | string }}|{{ {'b': 1, 'a': [2]} | pprint }}|{{ [[1], [2]] | join(',') }}|"
         "{{ 'a' ~ [1, 'b'] ~ 2 }}|{{ [1, 2, 3, 4] | slice(2) | list }}|{{ d.items() }}|"
         "{% set ns = namespace(a=1) %}{{ ns }}|{{ '%s' % ([1],) }}|{{ 'é\\n' ~ ['é\\n'] }}")


def test_short_containers_render_as_jinja_renders_them(small_bound: None) -> None:
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    context = {"d": {"k": "v"}}
    ours = render(compile_template(SHORT).template, context)
    assert ours == plain.from_string(SHORT).render(context)
    assert ours.startswith("[1, 'a', None, 2.5]|{'k': [1, 2], 'j': 'v'}|('x', 3)|[1, 2]|")


def test_a_long_pprint_is_as_jinja_writes_it() -> None:
    source = "{{ {'key': [s] * 5, 'other': {'n': [s, 1]}} | pprint }}"
    plain = ImmutableSandboxedEnvironment()
    context = {"s": "word " * 30}
    ours = render(compile_template(source).template, context)
    assert ours == plain.from_string(source).render(context)
    assert ours.count("\n") > 10
