"""Write docs/config_reference.md from the code: every section of the experiment config, every field,
its type, its default and the comment written beside it in the source.

    python scripts/config_reference.py            # rewrites docs/config_reference.md
    python scripts/config_reference.py --check    # exit 1 when the committed file is out of date

Nothing in the page is typed by hand. The sections are the fields of `Config`
(ragen_jax/experiment/config.py); each section's class may live elsewhere (`prompt` in
ragen_jax/text/conversation.py, `rollout` in ragen_jax/rollout/types.py, the algorithm's sections in
ragen_jax/experiment/sections.py). A field's text is the block of `#` comment lines right above it
plus its trailing comment; a field written right under a commented one without its own comment shares
that comment ("see `x` above"); PromptConfig documents its fields in its docstring (`name: text`),
which is read too. Defaults are those of `Config()`, as a config file starts from.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import re
import sys
import textwrap
import tokenize
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

OUT = Path("docs") / "config_reference.md"
COMMAND = "python scripts/config_reference.py"
MAX_DEFAULT = 70  # characters of a default's repr shown in the table (the system prompt is longer)


def _comments(source: str) -> dict[int, str]:
    """{line number (1-based): comment text without '#'} of every comment token of `source`."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def _docstring_fields(doc: str | None) -> dict[str, str]:
    """`name: text` / `a, b: text` entries of a class docstring (continuation lines indented deeper)."""
    out: dict[str, str] = {}
    if not doc:
        return out
    current: list[str] | None = None
    names: list[str] = []
    for line in inspect.cleandoc(doc).splitlines():
        m = re.match(r"^([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)$", line)
        if m:
            if current is not None:
                for n in names:
                    out[n] = " ".join(current)
            names, current = m.group(1).split(", "), [m.group(2).strip()]
        elif current is not None and line.startswith(" ") and line.strip():
            current.append(line.strip())
        else:
            if current is not None:
                for n in names:
                    out[n] = " ".join(current)
            current, names = None, []
    if current is not None:
        for n in names:
            out[n] = " ".join(current)
    return out


def field_comments(cls) -> dict[str, str]:
    """{field name: its comment} for the dataclass `cls`, read from its source."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    comments = _comments(source)
    body = ast.parse(source).body[0].body
    from_doc = _docstring_fields(cls.__doc__)
    out: dict[str, str] = {}
    previous: tuple[str, int] | None = None  # (the last field with a comment block above it, its line)
    last_line = None
    for node in body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            last_line = getattr(node, "end_lineno", None)
            previous = None
            continue
        name, line = node.target.id, node.lineno
        above = []
        i = line - 1
        while i >= 1 and lines[i - 1].strip().startswith("#"):
            above.insert(0, comments.get(i, ""))
            i -= 1
        trailing = comments.get(node.end_lineno) if node.end_lineno in comments and \
            not lines[node.end_lineno - 1].strip().startswith("#") else None
        text = " ".join(p for p in (" ".join(above), trailing or "") if p)
        follows = last_line is not None and i == last_line  # no blank line between it and the field before
        if text:
            out[name] = text
            # A block comment above may speak for the uncommented fields right under it; a trailing one not.
            previous = (name, line) if above and not trailing else None
        elif name in from_doc:
            out[name] = from_doc[name]
        elif follows and previous is not None:
            out[name] = f"see `{previous[0]}` above"
        else:
            out[name] = ""
            previous = None
        last_line = node.end_lineno
    return out


def _type(hint) -> str:
    s = getattr(hint, "__name__", None) if typing.get_origin(hint) is None else None
    if s is None:
        s = str(hint).replace("typing.", "")
    s = re.sub(r"Optional\[(.*)\]", r"\1 | None", s)
    return s.replace("NoneType", "None")


def _default(value) -> str:
    r = repr(value)
    if len(r) > MAX_DEFAULT:
        r = r[: MAX_DEFAULT - 5] + f"... ({len(value)} characters)" if isinstance(value, str) else r[:MAX_DEFAULT] + "..."
    return f"`{r}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or "-"


def _where(cls) -> str:
    return Path(inspect.getsourcefile(cls)).resolve().relative_to(ROOT).as_posix()


def _class_doc(cls) -> str:
    """The first paragraph of the class's own docstring, on one line ("" for a dataclass without one)."""
    doc = cls.__doc__
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature
        return ""
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split())


def sections():
    """[(section name, its class, its comment in Config, its defaults)] in Config's order."""
    from ragen_jax.experiment.config import Config

    cfg = Config()
    hints = typing.get_type_hints(Config)
    notes = field_comments(Config)
    return [(f.name, hints[f.name], notes.get(f.name, ""), getattr(cfg, f.name)) for f in dataclasses.fields(Config)]


def render() -> str:
    out = ["# Config reference", "",
           f"(generated by `{COMMAND}` from the dataclasses; do not edit. "
           "`tests/test_config_reference.py` fails when it is out of date.)", "",
           "Every key a config file (`configs/*.py`, `get_config() -> Config`) or a command line "
           "(`--config.<section>.<key>=<value>`, `--<family>.<section>.<key>=<value>` for launch/demo.py) can set, "
           "with its default and the comment beside it in the source. The old `algo.*` names are translated by "
           "ragen_jax/experiment/legacy.py; rules across sections are in ragen_jax/experiment/rules.py. "
           "How to use them: [guide/train.md](guide/train.md).", "",
           "| section | class | what |", "|---|---|---|"]
    secs = sections()
    for name, cls, note, _ in secs:
        doc = _class_doc(cls)
        what = doc.split(". ")[0].rstrip(".") + "." if doc else ("" if note.startswith("see `") else note)
        out.append(f"| [`{name}`](#{name}) | `{cls.__name__}` ({_where(cls)}) | {_cell(what)} |")
    out.append("")
    for name, cls, note, values in secs:
        out += [f"## {name}", ""]
        doc = _class_doc(cls)
        if doc:
            out += [doc, ""]
        out += [f"`{cls.__name__}` in {_where(cls)}.", "",
                "| key | type | default | what |", "|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        comments = field_comments(cls)
        for f in dataclasses.fields(cls):
            out.append(f"| `{name}.{f.name}` | `{_type(hints[f.name])}` | {_default(getattr(values, f.name))} "
                       f"| {_cell(comments.get(f.name, ''))} |")
        out.append("")
    return "\n".join(out)


def all_keys() -> list[str]:
    """Every `section.field` of Config (what the page must hold)."""
    return [f"{name}.{f.name}" for name, cls, _, _ in sections() for f in dataclasses.fields(cls)]


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = ROOT / OUT
    new = render()
    old = path.read_text() if path.exists() else None
    if "--check" in argv:
        if old != new:
            print(f"{OUT} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
        return 0
    if old != new:
        path.write_text(new)
    print(f"{'regenerated' if old != new else 'unchanged'}: {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
