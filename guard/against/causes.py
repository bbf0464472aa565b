"""The known causes on a target's row (``guard.targets.table.Cause``), matched to a failing forward comparison.

A row's causes are data: what the stack's forward does differently from transformers', and where it applies
(the file's rope_theta, its tied embeddings, its model_type, the comparison's dtype, the load's options).
Where every parameter the stack holds is bit-exact, such a cause is the whole story: the stack's configuration
differs, not the file (``guard.against.run`` says so in the finding).
"""

from __future__ import annotations

from typing import Any

from guard.targets.table import Cause, Target


def config_value(config: dict[str, Any], key: str) -> float | None:
    """config.json's number under ``key``; rope_theta at the top level (transformers 4), else in rope_parameters
    (transformers 5)."""
    value = _number(config.get(key))
    if key == "rope_theta" and value is None:
        parameters = config.get("rope_parameters")
        value = _number(parameters.get("rope_theta")) if isinstance(parameters, dict) else None
    return value


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def applies(cause: Cause, config: dict[str, Any], options: dict[str, Any], dtype: str) -> bool:
    if cause.dtypes and dtype not in cause.dtypes:
        return False
    if cause.avoided_by and options.get(cause.avoided_by):
        return False
    if cause.model_types and not str(config.get("model_type", "")).startswith(cause.model_types):
        return False
    if cause.rope_theta_nested and "rope_theta" in config:
        return False
    for key, value in cause.config_not.items():
        found = config_value(config, key)
        if found is None or found == value:
            return False
    if cause.tied:
        from guard.convert.maxtext.source_config import tied

        if not tied(config):
            return False
    return True


def known_causes(target: Target, config: dict[str, Any], options: dict[str, Any], dtype: str) -> tuple[str, ...]:
    """The row's causes that apply to a failing comparison computed in ``dtype`` (F32, BF16, F16) under a load
    with ``options``, each in its own words."""
    return tuple(cause.says.format(**{key: config_value(config, key) for key in cause.config_not})
                 for cause in target.causes if applies(cause, config, options, dtype))
