"""A tokenizer directory's files are read up to a bound no real model's reach, and a file
past it (or no regular file) is refused naming it and the bound before it is read; a
chat template's single operation that would build a string, a list or a number past the
render bound is refused naming the template, before it is built (a template is compiled
at start-up: ``'x' * 3000000000`` there held 3 GB before the first request)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvwire.chat_messages import ChatFormatError
from kvwire.chat_template import compile_template, render
from kvwire.tokenizer import (
    MAX_CONFIG_BYTES,
    MAX_TEMPLATE_BYTES,
    MAX_TOKENIZER_BYTES,
    load_tokenizer,
)
from kvwire.tokenizer_build import ASSET_DIR

CHAT = [{"role": "user", "content": "Find clause 4."}]


def _directory(tmp_path: Path) -> Path:
    shutil.copy(ASSET_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    return tmp_path


def _sparse(file: Path, size: int) -> None:
    file.touch()
    os.truncate(file, size)  # no byte of it written: a hole the size of a huge file


@pytest.mark.parametrize(("name", "bound"), [
    ("tokenizer.json", MAX_TOKENIZER_BYTES),
    ("tokenizer_config.json", MAX_CONFIG_BYTES),
    ("chat_template.jinja", MAX_TEMPLATE_BYTES),
    ("additional_chat_templates/tool_use.jinja", MAX_TEMPLATE_BYTES),
])
def test_a_file_past_its_bound_is_refused_naming_it_and_the_bound(
        tmp_path: Path, name: str, bound: int) -> None:
    directory = _directory(tmp_path)
    (directory / name).parent.mkdir(exist_ok=True)
    _sparse(directory / name, bound + 1)
    with pytest.raises(ValueError) as err:
        load_tokenizer(directory)
    assert str(directory / name) in str(err.value)
    assert f"{bound:,}" in str(err.value)


def test_real_sizes_are_within_the_bounds() -> None:
    # Gemma's tokenizer.json, the largest of the common ones, is ~35 MB; templates ~100 KB
    assert MAX_TOKENIZER_BYTES >= 4 * 35_000_000
    assert MAX_CONFIG_BYTES >= 10_000_000 and MAX_TEMPLATE_BYTES >= 1_000_000


def test_templates_past_the_bound_all_together_are_refused(tmp_path: Path) -> None:
    directory = _directory(tmp_path)
    (directory / "additional_chat_templates").mkdir()
    for name in ("a", "b", "c"):  # each within the bound, together past it
        _sparse(directory / "additional_chat_templates" / f"{name}.jinja",
                MAX_TEMPLATE_BYTES // 2)
    with pytest.raises(ValueError, match=r"c\.jinja.*all together"):
        load_tokenizer(directory)


def test_a_config_template_past_the_bound_is_refused_naming_the_field(
        tmp_path: Path) -> None:
    directory = _directory(tmp_path)
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ messages }}" + " " * MAX_TEMPLATE_BYTES}))
    with pytest.raises(ValueError, match=r"tokenizer_config\.json's chat_template holds "
                                         r"4,194,3[0-9][0-9] characters"):
        load_tokenizer(directory)


@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json"])
def test_a_pipe_in_place_of_a_file_is_refused_at_once(tmp_path: Path, name: str) -> None:
    directory = _directory(tmp_path)
    (directory / name).unlink(missing_ok=True)
    os.mkfifo(directory / name)  # opened to be read, it would wait for a writer forever
    with pytest.raises(ValueError, match=rf"{name} is not a regular file"):
        load_tokenizer(directory)


BOMBS = {
    "repeat": "{{ 'x' * 3000000000 }}",
    "repeat-list": "{{ ([0] * 3000000000) | length }}",
    "power": "{{ (2 ** 3000000000) > 1 }}",
    "doubling": "{% set ns = namespace(s='x' * 1000000) %}{% for i in range(40) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    "percent": "{{ '%3000000000s' % 'x' }}",
    "format-filter": "{{ '%3000000000s' | format('x') }}",
    "str-format": "{{ '{:>3000000000}'.format('x') }}",
    "center": "{{ 'x' | center(3000000000) }}",
    "ljust": "{{ 'x'.ljust(3000000000) }}",
    "join": "{{ (['x' * 30000000] * 1000) | join }}",
    "replace": "{{ ('x' * 30000000) | replace('x', 'yyyyy') }}",
    "set-block": "{% set t %}{% for i in range(100000) %}{{ 'x' * 30000000 }}{% endfor %}"
                 "{% endset %}{{ t | length }}",
    "sum": "{{ ([[0] * 30000000] * 1000) | sum(start=[]) | length }}",
    "lipsum": "{{ lipsum(3000000000) }}",
}


@pytest.mark.parametrize("source", BOMBS.values(), ids=BOMBS.keys())
def test_a_template_building_past_the_bound_is_refused_naming_it(
        tmp_path: Path, source: str) -> None:
    directory = _directory(tmp_path)
    (directory / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m['content'] }}{% endfor %}" + source)
    tok = load_tokenizer(directory)  # compiled without building it
    with pytest.raises(ChatFormatError) as err:
        tok.render_chat(CHAT)
    assert f"the chat template 'default' of {directory / 'tokenizer.json'}" in str(err.value)
    assert "past the " in str(err.value)


def test_the_operations_within_the_bound_render_as_jinja_renders_them() -> None:
    source = (
        "{{ 'ab' * 3 }}|{{ [1] * 2 }}|{{ 2 ** 10 }}|{{ 'a' + 'b' }}|{{ [1] + [2] }}|"
        "{{ '%s-%03d' % ('a', 7) }}|{{ '%(k)s' % {'k': 'v'} }}|{{ '%s'|format('f') }}|"
        "{{ '{:>4}{}'.format('x', 'y') }}|{{ 'a' ~ 1 ~ 'b' }}|{{ 'x'|center(5) }}|"
        "{{ 'a\nb'|indent(2, first=true) }}|{{ [1, 2]|join(',') }}|"
        "{{ [{'a': 'q'}, {'a': 'r'}]|join('+', attribute='a') }}|{{ 'a b'|replace(' ', '_') }}|"
        "{{ [1, 2, 3]|batch(2, 0)|list }}|{{ [[1], [2, 3]]|sum(start=[]) }}|{{ [1, 2]|sum }}|"
        "{{ ','.join(['p', 'q']) }}|{{ 'a\tb'.expandtabs(4) }}|{{ '7'.zfill(3) }}|"
        "{% set t %}{% for i in range(3) %}{{ i }}{% endfor %}{% endset %}{{ t }}|"
        "{% macro m(x) %}<{{ x }}>{% endmacro %}{{ m(1) }}")
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    ours = render(compile_template(source).template, {})
    assert ours == plain.from_string(source).render()
    assert ours.startswith("ababab|[1, 1]|1024|ab|[1, 2]|a-007|v|f|   xy|a1b|  x  |")


def test_tojson_of_one_text_referenced_many_times_is_refused(tmp_path: Path) -> None:
    # 1,000 references to one 30 MB text: small to hold, 30 GB as JSON text
    directory = _directory(tmp_path)
    (directory / "chat_template.jinja").write_text(
        "{{ messages | tojson }}{{ (['x' * 30000000] * 1000) | tojson }}")
    with pytest.raises(ChatFormatError, match=r"renders to more than 33,554,432 characters"):
        load_tokenizer(directory).render_chat(CHAT)
