"""The config's legacy names: the old `algo.*` section (key by key, and V1's filter knobs translated once
`rollout.num_groups` is known), GiGPO's released `advantage.gigpo_*` names (now `advantage.options`), and
keys that moved since runs were saved. Overrides, `cfg.algo.x = v` in config files and saved runs'
config.json keep working through this module, with a deprecation warning; they are removed after this
release (README). Nothing here imports the schema (`experiment/config.py` imports this).
"""

from __future__ import annotations

import dataclasses
import typing
import warnings
from typing import Optional

from ragen_jax.algorithms.filters import num_kept_groups
from ragen_jax.algorithms.gigpo import GiGPOOptions
from ragen_jax.experiment.sections import AdvantageConfig, ConfigError, FilterConfig, choice, positive
from ragen_jax.rollout.types import RolloutConfig


def _section_keys(section: str, names: str, renames: dict | None = None) -> dict:
    renames = renames or {}
    return {old: (section, renames.get(old, old)) for old in names.split()}


# The old `algo` section, key by key: old name -> (section, key). Overrides, `cfg.algo.x = v` in config
# files and saved config.json files keep working through it, with a deprecation warning.
LEGACY_ALGO_KEYS = {
    **_section_keys("advantage", "adv_estimator reward_norm gamma lam bi_level_gae reward_placement "
                    "soft_advantage_reweight gigpo_weight gigpo_norm gigpo_gamma",
                    {"adv_estimator": "estimator", "soft_advantage_reweight": "soft_reweight",
                     **{f"gigpo_{k}": f"options.{k}" for k in ("weight", "norm", "gamma")}}),
    **_section_keys("loss", "eps_low eps_high dual_clip loss_agg entropy_coef kl_coef kl_type kl_in_reward "
                    "value_clip tis tis_cap tis_geo_mask", {"loss_agg": "agg"}),
    **_section_keys("batching", "ppo_epochs mini_batch_size micro_batch_size critic_warmup"),
    **_section_keys("filter", "filter_metric filter_include_zero filter_top_p_mode filter_max_groups "
                    "filter_rounding filter_loss_scaling",
                    {f"filter_{k}": k for k in ("metric", "include_zero", "top_p_mode", "max_groups", "rounding",
                                                "loss_scaling")}),
}
# The old filter knobs with no one new key (V1's ratio / mode / type / cover, and RAGEN-2's
# strategy / value / select whose None meant "take the V1 knob"): old name -> (type, V1 default).
# They are translated together by `translate_v1_filter` once rollout.num_groups is known.
V1_FILTER_KEYS = {"filter_ratio": (float, 0.25), "filter_mode": (str, "largest"), "filter_type": (str, "top_k"),
                  "filter_cover": (float, 0.9), "filter_strategy": (Optional[str], None),
                  "filter_value": (Optional[float], None), "filter_select": (Optional[str], None)}


# GiGPO's options under their released names (advantage.gigpo_weight, ...): now advantage.options.<name>.
LEGACY_OPTION_KEYS = {f"gigpo_{k}": k for k in ("weight", "norm", "gamma")}


def _deprecated(old: str, new: str):
    warnings.warn(f"algo.{old} is deprecated; use {new}", FutureWarning, stacklevel=4)


def _get_key(section_obj, key: str):
    """A section's key; "options.<name>": the estimator option (its default while unset)."""
    if key.startswith("options."):
        name = key.split(".", 1)[1]
        default = {f.name: f.default for f in dataclasses.fields(GiGPOOptions)}.get(name)
        return section_obj.options.get(name, default)
    return getattr(section_obj, key)


def _set_key(section_obj, key: str, value) -> None:
    if key.startswith("options."):
        section_obj.options[key.split(".", 1)[1]] = value
    else:
        setattr(section_obj, key, value)


def _key_hint(cfg, section: str, key: str):
    """The type a legacy key's value is coerced to."""
    if key.startswith("options."):
        return typing.get_type_hints(GiGPOOptions)[key.split(".", 1)[1]]
    return typing.get_type_hints(type(getattr(cfg, section)))[key]


def legacy_target(cfg, parts: list[str]):
    """For an override of an old name (`algo.<x>`, `advantage.gigpo_<x>`): (the type its value is
    coerced to, a setter that warns and writes the new key); None for any other key."""
    if parts[0] == "algo" and len(parts) == 2:
        name = parts[1]
        if name in LEGACY_ALGO_KEYS:
            return _key_hint(cfg, *LEGACY_ALGO_KEYS[name]), lambda v: setattr(cfg.algo, name, v)
        if name in V1_FILTER_KEYS:
            return V1_FILTER_KEYS[name][0], lambda v: setattr(cfg.algo, name, v)
        raise ConfigError(f"unknown config key 'algo.{name}'; the algorithm's keys are now in advantage, loss, "
                          "filter and batching (docs/training.md)")
    if parts[0] == "advantage" and len(parts) == 2 and parts[1] in LEGACY_OPTION_KEYS:
        key = f"options.{LEGACY_OPTION_KEYS[parts[1]]}"

        def set_option(v):
            warnings.warn(f"advantage.{parts[1]} is deprecated; use advantage.{key}", FutureWarning, stacklevel=4)
            _set_key(cfg.advantage, key, v)

        return _key_hint(cfg, "advantage", key), set_option
    return None


def translate_v1_filter(legacy: dict, current: FilterConfig, num_groups: int) -> dict:
    """The filter section's strategy / value / select / max_groups that the old knobs in `legacy` meant,
    exactly as the old AlgoConfig.filter_spec: an explicit RAGEN-2 strategy (old name, or a non-default
    filter.strategy) wins; otherwise filter_type variance_cover = top_p linear with filter_cover, at most
    num_kept_groups(P, filter_ratio, rounding) groups, and top_k = filter_ratio."""
    # A top_k section's value and select are V1's filter_ratio and filter_mode (configs now set those).
    current_v1 = {"filter_mode": current.select}
    if current.strategy == "top_k":
        current_v1["filter_ratio"] = current.value
    v1 = {k: legacy.get(k, current_v1.get(k, d)) for k, (_, d) in V1_FILTER_KEYS.items()}
    if isinstance(v1["filter_ratio"], bool) or not isinstance(v1["filter_ratio"], (int, float)) \
            or not 0 < v1["filter_ratio"] <= 1:
        raise ConfigError(f"algo.filter_ratio must be in (0, 1], got {v1['filter_ratio']!r}")
    choice("algo.filter_mode", v1["filter_mode"], ("largest", "smallest"))
    choice("algo.filter_type", v1["filter_type"], ("top_k", "variance_cover"))
    positive("algo.filter_cover", v1["filter_cover"])
    choice("filter.rounding", current.rounding, ("floor", "ceil"))
    strategy, value, select = v1["filter_strategy"], v1["filter_value"], v1["filter_select"]
    if strategy is None and current.strategy != FilterConfig.strategy and "filter_type" not in legacy:
        strategy, value = current.strategy, current.value if value is None else value
    legacy_cover = strategy is None and v1["filter_type"] == "variance_cover"
    strategy = strategy or ("top_p" if legacy_cover else "top_k")
    if value is None:
        if strategy in ("top_k_abs", "min_p"):
            raise ConfigError(f"algo.filter_strategy={strategy!r} needs a value; set filter.value "
                              "(top_k_abs: a number of groups; min_p: a fraction of the best score)")
        value = v1["filter_ratio"] if strategy == "top_k" else v1["filter_cover"]
    max_groups = current.max_groups
    if legacy_cover and not max_groups:
        max_groups = num_kept_groups(num_groups, v1["filter_ratio"], current.rounding)
    return {"strategy": strategy, "value": value, "select": select or v1["filter_mode"], "max_groups": max_groups}


class LegacyAlgo:
    """`cfg.algo`: the old section's names, read and written on the new sections (deprecated)."""

    def __init__(self, cfg):
        object.__setattr__(self, "cfg", cfg)

    def __getattr__(self, name):
        cfg = object.__getattribute__(self, "cfg")
        if name in LEGACY_ALGO_KEYS:
            section, key = LEGACY_ALGO_KEYS[name]
            _deprecated(name, f"{section}.{key}")
            return _get_key(getattr(cfg, section), key)
        if name in V1_FILTER_KEYS:
            _deprecated(name, "filter.strategy / filter.value / filter.select / filter.max_groups")
            return cfg.legacy_filter.get(name, V1_FILTER_KEYS[name][1])
        raise AttributeError(f"algo has no key {name!r}; the algorithm's keys are in the sections advantage, loss, "
                             "filter and batching")

    def __setattr__(self, name, value):
        cfg = object.__getattribute__(self, "cfg")
        if name in LEGACY_ALGO_KEYS:
            section, key = LEGACY_ALGO_KEYS[name]
            _deprecated(name, f"{section}.{key}")
            cfg.legacy_names[f"{section}.{key}"] = f"algo.{name}"
            _set_key(getattr(cfg, section), key, value)
        elif name in V1_FILTER_KEYS:
            _deprecated(name, "filter.strategy / filter.value / filter.select / filter.max_groups")
            cfg.legacy_filter[name] = value
            if name in ("filter_strategy", "filter_value", "filter_select"):
                cfg.legacy_names[name.replace("_", ".", 1)] = f"algo.{name}"
        else:
            raise ConfigError(f"unknown config key 'algo.{name}'; the old algo keys are "
                              f"{', '.join([*LEGACY_ALGO_KEYS, *V1_FILTER_KEYS])}")


# Keys that moved since runs were saved: old dotted name -> new one (the old algo section: LEGACY_ALGO_KEYS).
# A saved run directory's config.json is read through `migrate_saved`, so old runs resume and evaluate
# unchanged.
RENAMED_KEYS = {"model.cache_dtype": "rollout.cache_dtype"}


def migrate_saved(d: dict) -> dict:
    """A saved config dict with renamed keys moved to their current place (a new dict)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in d.items()}
    for old, new in RENAMED_KEYS.items():
        (os_, ok), (ns, nk) = old.split("."), new.split(".")
        if ok in out.get(os_, {}):
            out.setdefault(ns, {})[nk] = out[os_].pop(ok)
    legacy = {}
    adv = out.setdefault("advantage", {})
    estimator = adv.get("estimator", out.get("algo", {}).get("adv_estimator", AdvantageConfig.estimator))
    for old, value in [*out.pop("algo", {}).items(), *((k, adv.pop(k)) for k in list(adv) if k in LEGACY_OPTION_KEYS)]:
        if old in LEGACY_OPTION_KEYS:
            # Saved before advantage.options: GiGPO's three keys were saved for every estimator; they
            # acted only under gigpo, and only a non-default value is a setting.
            name = LEGACY_OPTION_KEYS[old]
            if estimator == "gigpo" and value != getattr(GiGPOOptions(), name):
                adv.setdefault("options", {})[name] = value
        elif old in LEGACY_ALGO_KEYS:
            section, key = LEGACY_ALGO_KEYS[old]
            out.setdefault(section, {})[key] = value
        elif old in V1_FILTER_KEYS:
            legacy[old] = value
        else:
            raise ConfigError(f"saved config has unknown keys in algo: {old}")
    if legacy:
        num_groups = out.get("rollout", {}).get("num_groups", RolloutConfig.num_groups)
        out.setdefault("filter", {}).update(translate_v1_filter(legacy, FilterConfig(**out.get("filter", {})), num_groups))
    return out
