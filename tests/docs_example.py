"""The worked examples of the docs as code: the ```python block that follows a heading, executed as a
module, so that what a newcomer copies is what the tests run."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs"


def code_after(page: str, heading: str, index: int = 0) -> str:
    """The `index`-th ```python block of `docs/<page>` under the section `## <heading>`."""
    text = (DOCS / page).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```python\n(.*?)```", text[start: end if end > 0 else None], re.DOTALL)
    return blocks[index]


def run_example(page: str, heading: str, name: str, index: int = 0) -> types.ModuleType:
    """Execute that block as module `name` (its classes pickle and print under that name)."""
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses resolve their annotations through it
    exec(compile(code_after(page, heading, index), f"docs/{page} ({heading})", "exec"), module.__dict__)
    return module
