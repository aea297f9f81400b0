"""A chat template's ``%`` or ``str.format`` with a width read from its arguments is
measured by the arguments that are widths: a large number formatted as a value renders,
a large width is refused before it is built."""

from __future__ import annotations

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvwire.chat_template import TemplateBuildTooLong, compile_template, render

RENDERED = (
    "{{ '%*d' % (3, 1700000000) }}|{{ '%-*.*f|%s' % (6, 2, 1.0, 1700000000) }}|"
    "{{ '%*d' | format(3, 1700000000) }}|{{ '%% %(a)s' % {'a': 1700000000} }}|"
    "{{ '{:>{}} {}'.format('x', 3, 1700000000) }}|{{ '{0:{1}}{2}'.format('x', 2, 1700000000) }}|"
    "{{ '{:{w}}{n}'.format('x', w=2, n=1700000000) }}")

BOMBS = {
    "percent-width": "{{ '%3000000000s' % 'x' }}",
    "percent-star": "{{ '%*s' % (3000000000, 'x') }}",
    "percent-star-after": "{{ '%s%*s' % ('a', -3000000000, 'x') }}",
    "percent-precision-star": "{{ '%.*d' % (3000000000, 1) }}",
    "percent-nested-key": "{{ '%(a(b))3000000000s' % {'a(b)': 'x'} }}",
    "filter-star": "{{ '%*s' | format(3000000000, 'x') }}",
    "format-auto": "{{ '{:{}}'.format('x', 3000000000) }}",
    "format-index": "{{ '{0:{1}}'.format('x', 3000000000) }}",
    "format-keyword": "{{ '{:{w}}'.format('x', w=3000000000) }}",
    "format-text-width": "{{ '{:{}}'.format('x', '3000000000') }}",
    "format-joined-digits": "{{ '{:{}000000000}'.format('x', 3) }}",
    "format-precision": "{{ '{:{}.{}f}'.format(1.0, 5, 3000000000) }}",
}


def test_a_large_number_formatted_as_a_value_renders_as_jinja_renders_it() -> None:
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    ours = render(compile_template(RENDERED).template, {})
    assert ours == plain.from_string(RENDERED).render()
    assert ours.startswith("1700000000|1.00  |1700000000|1700000000|% 1700000000|")


@pytest.mark.parametrize("source", BOMBS.values(), ids=BOMBS.keys())
def test_a_large_width_read_from_the_arguments_is_refused(source: str) -> None:
    with pytest.raises(TemplateBuildTooLong, match=r"past the 33,554,432"):
        render(compile_template(source).template, {})
