"""The project's tokenizer made a Llama's: its post-processor puts ``<s>`` before every
text encoded with special tokens, and its chat template writes ``<s>`` itself."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, processors

from kvwire.tokenizer_build import ASSET_DIR

BOS = "<s>"
TEMPLATE = ("{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n"
            "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}")


def bos_tokenizer(directory: Path) -> tuple[Path, int]:
    """Write the tokenizer into ``directory``; it and the id of ``<s>``."""
    tok = Tokenizer.from_file(str(ASSET_DIR / "tokenizer.json"))
    tok.add_special_tokens([BOS])
    bos = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A",
                                                       special_tokens=[(BOS, bos)])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": BOS, "chat_template": TEMPLATE}))
    return directory, bos
