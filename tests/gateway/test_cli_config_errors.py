"""A gateway config that is no YAML is refused in one line naming the file, the line and
the column where it goes wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import load_config
from policies.config import ConfigError


@pytest.mark.parametrize("text, said", [
    ('replicas:\n  - {id: r0, url: "http://127.0.0.1:8101"\n',
     ":3:1: invalid YAML: expected ',' or '}', but got '<stream end>' (while parsing a flow "
     "mapping at line 2)"),
    ("port: 80\n  host: x\n", ":2:7: invalid YAML: mapping values are not allowed here"),
    ("replicas:\n\t- {id: r0}\n", ":2:1: invalid YAML: found character '\\t' that cannot "
     "start any token"),
])
def test_a_yaml_typo_is_named_by_file_line_and_column_in_one_line(
        tmp_path: Path, text: str, said: str) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert message.startswith(f"{path}{said}") and "\n" not in message
    assert "<unicode string>" not in message
