"""docs/config_reference.md is what scripts/config_reference.py writes from the Config dataclasses today,
and it holds every field of every section (a field added without regenerating fails here)."""

from __future__ import annotations

import dataclasses
import typing

from ragen_jax.experiment.config import Config
from scripts import config_reference

REGENERATE = f"run `{config_reference.COMMAND}` and commit docs/config_reference.md"


def test_committed_reference_is_current():
    committed = (config_reference.ROOT / config_reference.OUT).read_text()
    assert committed == config_reference.render(), f"docs/config_reference.md is out of date: {REGENERATE}"


def test_every_field_of_every_section_is_listed():
    committed = (config_reference.ROOT / config_reference.OUT).read_text()
    hints = typing.get_type_hints(Config)
    keys = [f"{s.name}.{f.name}" for s in dataclasses.fields(Config) for f in dataclasses.fields(hints[s.name])]
    assert keys == config_reference.all_keys()
    missing = [k for k in keys if f"| `{k}` |" not in committed]
    assert not missing, f"not in docs/config_reference.md: {', '.join(missing)}; {REGENERATE}"
    assert all(f"\n## {s.name}\n" in committed for s in dataclasses.fields(Config))


def test_comments_are_read_from_the_source():
    """Hand-checked against the source: a comment block above, a trailing comment, a field sharing the block
    above it, a docstring entry (PromptConfig), and a field with no comment at all."""
    from ragen_jax.experiment.sections import LossConfig
    from ragen_jax.rollout.types import RolloutConfig
    from ragen_jax.text.conversation import PromptConfig

    loss = config_reference.field_comments(LossConfig)
    assert loss["eps_low"].startswith("PPO clip, decoupled (StarPO-S \"clip-higher\"")
    assert loss["eps_high"] == "see `eps_low` above"
    assert loss["dual_clip"] == "dual-clip constant c for negative advantages"
    assert loss["entropy_coef"] == ""  # under agg, whose comment is trailing: shared with nothing
    roll = config_reference.field_comments(RolloutConfig)
    assert roll["top_k"] == "see `temperature` above"
    assert roll["num_groups"].endswith("Reference: 8.")
    prompt = config_reference.field_comments(PromptConfig)
    assert prompt["max_response_tokens"] == "the per-turn generation budget; also the parser's byte-scan budget."
    assert prompt["reward_min"] == prompt["reward_max"]
