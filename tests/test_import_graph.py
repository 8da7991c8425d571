"""The package layout is the pipeline: each stage imports only from itself and the stages before it,
no module imports another in a cycle, and project imports sit at the top of modules (an import
inside a function needs a comment saying why, e.g. an optional dependency).

The truth here is the source itself, read with `ast` (nothing is imported)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Stage of each top-level part, in the order data flows.
STAGES = {
    "envs_jax": 0,
    "ragen_jax.runtime": 0,  # process set-up of the launchers; imports nothing of the project
    "ragen_jax.text": 1,  # tokenizer, state -> ids, parsing
    "ragen_jax.models": 2,
    "ragen_jax.rollout": 3,  # sampler, compiled rollout, teachers, rollout metrics
    "ragen_jax.algorithms": 4,  # advantages, losses, filters: pure functions
    "ragen_jax.trainer": 5,  # config, run setup, RL/SFT trainers, evaluation, checkpoints, logging
    "ragen_jax.recipes": 6,  # whole experiments (the CPU demo) used by launch/, scripts/, bench/
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _stage(module: str) -> int | None:
    best = None
    for prefix, stage in STAGES.items():
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, stage)
    return None if best is None else best[1]


def _project_imports(tree: ast.AST, module: str):
    """(imported module, line, at top level) for every import of envs_jax / ragen_jax."""
    top = {id(n) for n in tree.body}
    package = module if module in PACKAGES else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [base]
            # `from pkg import submodule` imports the submodule
            names += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
        for n in names:
            if n.split(".")[0] in ("envs_jax", "ragen_jax"):
                yield n, node.lineno, id(node) in top


FILES = sorted(p for d in ("ragen_jax", "envs_jax") for p in (ROOT / d).rglob("*.py"))
MODULES = {_module_name(p) for p in FILES}
PACKAGES = {_module_name(p) for p in FILES if p.name == "__init__.py"}


def _graph():
    graph, inner = {}, []
    for p in FILES:
        mod = _module_name(p)
        src = p.read_text()
        lines = src.splitlines()
        edges = set()
        for target, line, at_top in _project_imports(ast.parse(src), mod):
            while target not in MODULES and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in MODULES and target != mod:
                edges.add(target)
            if not at_top:
                commented = "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")
                if not commented:
                    inner.append(f"{mod}:{line}")
        graph[mod] = edges
    return graph, inner


def test_every_module_has_a_stage():
    assert [m for m in MODULES if _stage(m) is None and m != "ragen_jax"] == []


def test_imports_follow_the_stage_order():
    graph, _ = _graph()
    against = [f"{m} (stage {_stage(m)}) imports {t} (stage {_stage(t)})"
               for m, ts in graph.items() for t in ts
               if _stage(m) is not None and _stage(t) is not None and _stage(t) > _stage(m)]
    assert against == []


def test_no_import_cycles():
    graph, _ = _graph()
    # A package's __init__ re-exporting its submodules is not a cycle of the code: drop the edges
    # from a module to the package that contains it (Python resolves those through the submodule).
    def parents(m):
        parts = m.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    g = {m: {t for t in ts if t not in parents(m)} for m, ts in graph.items()}
    state, cycles = {}, []

    def visit(m, stack):
        state[m] = "open"
        stack.append(m)
        for t in sorted(g.get(m, ())):
            if state.get(t) == "open":
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = "done"

    for m in sorted(g):
        if m not in state:
            visit(m, [])
    assert cycles == []


def test_project_imports_are_at_the_top():
    _, inner = _graph()
    assert inner == [], "imports inside functions without a comment saying why"


def test_the_checker_sees_a_violation(tmp_path):
    # The checks above must be able to fail: a later-stage import and an inner import are found.
    tree = ast.parse("from ragen_jax.trainer.config import Config\ndef f():\n    from ragen_jax.models import Qwen2\n")
    found = list(_project_imports(tree, "ragen_jax.text.render"))
    assert ("ragen_jax.trainer.config", 1, True) in found
    assert ("ragen_jax.models", 3, False) in found
    assert _stage("ragen_jax.trainer.config") > _stage("ragen_jax.text.render")
