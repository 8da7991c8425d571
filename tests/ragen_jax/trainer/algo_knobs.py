"""Test helpers: set and read the algorithm's knobs across the advantage / loss / filter / batching
sections by their field names (no two sections share a field name)."""

from types import SimpleNamespace

SECTIONS = ("advantage", "loss", "filter", "batching")


def set_algo(cfg, **fields):
    """Set each field on the section that has it (a KeyError names a field no section has)."""
    for name, value in fields.items():
        section = next((s for s in SECTIONS if hasattr(getattr(cfg, s), name)), None)
        if section is None:
            raise KeyError(f"no section of {SECTIONS} has a field {name!r}")
        setattr(getattr(cfg, section), name, value)
    return cfg


def algo_view(cfg) -> SimpleNamespace:
    """All four sections' fields in one namespace (for the tests' plain reference implementations)."""
    return SimpleNamespace(**{k: v for s in SECTIONS for k, v in vars(getattr(cfg, s)).items()})
