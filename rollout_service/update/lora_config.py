"""What a caller names and configures a LoRA adapter with, checked before
anything is written or loaded: the adapter's name and its PEFT config.

The name becomes a folder under the server's adapter folder (lora.py), so a
name with a path in it wrote and later deleted outside it
("../../../tmp/x"), and one with a separator or over the file-name limit
failed there with INTERNAL. vLLM reads the config in its worker without
checking types: a bool passes `isinstance(x, int)`, a string alpha fails
inside the engine, a NaN alpha makes every logprob NaN. Bad names and bad
configs are refused here, with the field named.
"""

from __future__ import annotations

import math
import re
from typing import TypeGuard

from rollout_service.generation import json_input
from rollout_service.status.errors import InvalidArgument, short_repr

# The adapter-name rule: 1 to 64 characters, ASCII letters, digits, ".",
# "_" and "-", starting with a letter or a digit. So: no path separator, no
# "." or "..", no leading "-" (read as an option by tools), no space,
# control or non-ASCII character (names appear in logs and messages), and
# far below the 255-byte limit on a file name.
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1 to 64 ASCII letters, digits, '.', '_' or '-', starting with a letter or digit"

CONFIG_FIELD = "begin.adapter.config_json"

# The other fields vLLM's PEFTHelper reads (vllm/lora/peft_helper.py, 0.32),
# with the JSON types each takes. r, lora_alpha, target_modules and the two
# pattern maps are checked by hand below.
_TYPES: dict[str, tuple[type, ...]] = {
    "peft_type": (str,),
    "bias": (str,),
    "use_rslora": (bool,),
    "use_dora": (bool,),
    "lora_bias": (bool,),
    "use_qalora": (bool,),
    "init_lora_weights": (bool, str),
    "modules_to_save": (list, type(None)),
    "alora_invocation_tokens": (list, type(None)),
    "layer_replication": (list, type(None)),
    "use_bdlora": (dict, type(None)),
}
_JSON_TYPE = {
    str: "a string",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    type(None): "null",
}


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The items of the list fields above.
_ITEMS = {
    "modules_to_save": ("a string", lambda v: isinstance(v, str)),
    "alora_invocation_tokens": ("an integer", _is_int),
}


def check_name(name: str, field: str) -> None:
    """Refuses an adapter name outside ADAPTER_NAME, naming `field`."""
    if not ADAPTER_NAME.fullmatch(name):
        got = "it is empty" if not name else f"got {short_repr(name)}"
        raise InvalidArgument(field, f"an adapter name is {NAME_RULE}; {got}")


def _check_rank(value: object, field: str, max_rank: int) -> int:
    if not _is_int(value) or value < 1:
        raise InvalidArgument(field, f"must be a positive integer, got {short_repr(value)}")
    if value > max_rank:
        raise InvalidArgument(field, f"{value} is over the server's --max-lora-rank ({max_rank})")
    return value


def _check_alpha(value: object, field: str) -> None:
    if not _is_number(value) or not math.isfinite(value):
        raise InvalidArgument(field, f"must be a finite number, got {short_repr(value)}")


def _check_target_modules(value: object, field: str) -> None:
    # PEFT takes a list of module names or one regular expression.
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not names:
        raise InvalidArgument(
            field, f"must list the adapted modules (a non-empty list), got {short_repr(value)}"
        )
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"{field}[{i}]", f"must be a module name, got {short_repr(name)}")


def _check_patterns(config: dict, max_rank: int) -> None:
    for key, check in (("rank_pattern", "rank"), ("alpha_pattern", "alpha")):
        patterns = config.get(key)
        if patterns is None:
            continue
        field = f"{CONFIG_FIELD}.{key}"
        if not isinstance(patterns, dict):
            raise InvalidArgument(field, f"must be an object, got {short_repr(patterns)}")
        for pattern, value in patterns.items():
            where = f"{field}[{short_repr(pattern)}]"
            if check == "rank":
                _check_rank(value, where, max_rank)
            else:
                _check_alpha(value, where)


def peft_config(config_json: str, max_rank: int) -> tuple[dict, int]:
    """The PEFT adapter_config.json a caller sent, checked, with defaults
    filled in (peft_type LORA, lora_alpha = r), and its rank r."""
    config = json_input.load_object(config_json, CONFIG_FIELD, "PEFT's adapter_config.json")
    if "r" not in config:
        raise InvalidArgument(f"{CONFIG_FIELD}.r", "is required (the adapter's rank)")
    rank = _check_rank(config["r"], f"{CONFIG_FIELD}.r", max_rank)
    if "lora_alpha" in config:
        _check_alpha(config["lora_alpha"], f"{CONFIG_FIELD}.lora_alpha")
    _check_target_modules(config.get("target_modules"), f"{CONFIG_FIELD}.target_modules")
    for key, types in _TYPES.items():
        if key in config and not isinstance(config[key], types):
            expected = " or ".join(_JSON_TYPE[t] for t in types)
            raise InvalidArgument(
                f"{CONFIG_FIELD}.{key}", f"must be {expected}, got {short_repr(config[key])}"
            )
    for key, (expected, fits) in _ITEMS.items():
        for i, item in enumerate(config.get(key) or []):
            if not fits(item):
                raise InvalidArgument(
                    f"{CONFIG_FIELD}.{key}[{i}]", f"must be {expected}, got {short_repr(item)}"
                )
    _check_patterns(config, max_rank)
    config.setdefault("peft_type", "LORA")
    config.setdefault("lora_alpha", rank)
    return config, rank
