"""The config's rules across sections: what no one section can check alone (the mix against the batch,
the filter's kept rows against the mini-batches, the estimator against the critic, ...). Each section
validates its own keys (experiment/sections.py and experiment/config.py); `Config.validate` runs
those, then `check_across_sections`. Every problem is one sentence naming the keys.
"""

from __future__ import annotations

from ragen_jax.experiment.sections import ConfigError, choice
from ragen_jax.text.mix import format_mix


def check_across_sections(cfg) -> None:
    """ConfigError for the first rule `cfg` (a Config whose sections are each valid) breaks."""
    if cfg.rollout.cache_dtype is not None:
        choice("rollout.cache_dtype", cfg.rollout.cache_dtype, ("float32", "bfloat16"))
    choice("rollout.kv_cache_quant", cfg.rollout.kv_cache_quant, ("none", "int8"))
    _check_mix(cfg)
    _check_kept_rows(cfg)
    if cfg.advantage.record.needs_critic and cfg.model.critic == "none":
        raise ConfigError(f"advantage.estimator={cfg.advantage.estimator!r} needs a critic; set model.critic to "
                          "'separate' or 'shared'")


def _check_mix(cfg) -> None:
    r, mix = cfg.rollout, cfg.env.mix
    if not mix:
        return
    if sum(g for _, g in mix) != r.num_groups:
        raise ConfigError(f"env.mix={format_mix(mix)!r} has {sum(g for _, g in mix)} groups in all "
                          f"but rollout.num_groups={r.num_groups}; make the mix's group counts sum to num_groups")
    if 0 < r.groups_per_pass < r.num_groups:
        raise ConfigError("rollout.groups_per_pass does not work with env.mix yet (the mix assigns envs by row "
                          "of the whole batch); set rollout.groups_per_pass=0")
    if cfg.prompt.single_turn:
        raise ConfigError("prompt.context_window_mode='single_turn' does not work with env.mix yet (each turn is "
                          "scored behind one prompt prefix shared by every row); use 'full' or one env")


def _check_kept_rows(cfg) -> None:
    """The filter's kept rows (`FilterSpec.kept_rows`, the one definition) split into whole mini-batches."""
    r, b, spec = cfg.rollout, cfg.batching, cfg.filter.spec
    if spec.max_groups > r.num_groups:
        raise ConfigError(f"filter.max_groups={spec.max_groups} exceeds rollout.num_groups={r.num_groups}")
    slots, kept = spec.slots(r.num_groups), spec.kept_rows(r.num_groups, r.group_size)
    if kept < b.mini_batch_size:
        raise ConfigError(
            f"the filter keeps {kept} trajectories per iteration ({slots} of rollout.num_groups={r.num_groups} "
            f"groups ({spec.strategy}, value {spec.value}) x rollout.group_size={r.group_size}), fewer than "
            f"batching.mini_batch_size={b.mini_batch_size}")
    if kept % b.mini_batch_size:
        raise ConfigError(f"kept trajectories per iteration ({kept} = {slots} groups x {r.group_size}) must be a "
                          f"multiple of batching.mini_batch_size={b.mini_batch_size}")
    rows = r.num_groups * r.group_size
    if spec.input_name == "entropy" and rows % min(b.micro_batch_size or b.mini_batch_size, rows):
        raise ConfigError(f"filter.metric={spec.metric!r} runs the log-prob pass over all {rows} rollout rows "
                          "before filtering, in blocks of batching.micro_batch_size (0: mini_batch_size); the "
                          "block must divide the rows")
