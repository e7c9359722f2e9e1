"""Run configuration: YAML recipe (and its ``base:`` chain) merged over defaults, then dotted ``key.sub=value``
overrides. Keys renamed since earlier releases (:data:`RENAMED`) are refused with their new name; saved configs of
earlier runs are read through :func:`upgrade_config`."""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
from collections.abc import Iterable
from typing import Any

import yaml

from lightvision.engine.fsio import atomic_write


class ConfigError(ValueError):
    """A recipe or an override names an unknown key or has the wrong shape."""


# Old recipe key -> the key of the one schema both families share (docs/design.md "Recipe schema"). A key below a
# renamed one moves with it (model.kwargs.depth -> model.args.depth).
RENAMED: dict[str, str] = {
    "run_dir": "run.dir",
    "seed": "train.seed",
    "model.kwargs": "model.args",
    "model.args.attention_kwargs": "model.args.attn_kwargs",
    "model.img_size": "data.image_size",
    "data.test_split": "data.val_split",
    "data.batch_size": "train.batch_size",
    "optim.warmup_steps": "sched.warmup_steps",
    "train.clip_grad": "optim.clip_grad",
    "train.ckpt_every": "train.ckpt_every_steps",
    "train.eval_every": "train.eval_every_steps",
}
# What changed besides the name, said when the old key is refused.
_RENAME_NOTES = {
    "data.batch_size": " (now the batch of one process: the old global batch / (processes x train.grad_accum_steps))"
}


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (YAML 1.2), not as a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_value(text: str) -> Any:
    """Type a string like YAML does: ``3`` -> int, ``1e-4`` -> float, ``true`` -> bool, ``[1, 2]`` -> list."""
    return yaml.load(text, Loader=_Loader)


def _dotted_keys(cfg: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in cfg.items():
        keys.append(prefix + str(key))
        if isinstance(value, dict):
            keys.extend(_dotted_keys(value, f"{prefix}{key}."))
    return keys


def _unknown(key: str, root: dict, source: str) -> ConfigError:
    known = _dotted_keys(root)
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(close)}?" if close else f"known keys: {', '.join(known[:30])}"
    return ConfigError(f"unknown config key '{key}' in {source}; {hint}")


def _renamed(key: str) -> tuple[str, str] | None:
    """(old, new) when dotted ``key`` is, or lies below, a renamed key; else None."""
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return old, new + key[len(old) :]
    return None


def _refuse_renamed(keys: Iterable[str], source: str) -> None:
    for key in keys:
        if found := _renamed(key):
            raise ConfigError(
                f"config key '{key}' in {source} was renamed: use '{found[1]}'{_RENAME_NOTES.get(found[0], '')}"
            )


def upgrade_config(cfg: dict) -> dict:
    """A saved run config of an earlier release in the current layout (a copy): renamed keys moved to their new
    place, the resolved ``base`` dropped. A global ``data.batch_size`` becomes ``train.batch_size`` per
    accumulation step of one process."""
    out = copy.deepcopy(cfg)
    out.pop("base", None)
    if isinstance(out.get("data"), dict) and "batch_size" in out["data"]:
        accum = (out.get("train") or {}).get("grad_accum_steps") or 1
        out["data"]["batch_size"] = int(out["data"]["batch_size"]) // int(accum)
    for old, new in RENAMED.items():
        *old_path, old_leaf = old.split(".")
        node = out
        for part in old_path:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or old_leaf not in node:
            continue
        value = node.pop(old_leaf)
        *new_path, new_leaf = new.split(".")
        node = out
        for part in new_path:
            node = node.setdefault(part, {})
        node[new_leaf] = value
    return out


def _read_recipe(path: str | os.PathLike, chain: tuple[str, ...] = ()) -> list[tuple[str, dict]]:
    """(file, mapping) of the recipe ``path`` after those of its ``base`` chain (each ``base`` relative to the file
    naming it), ``base`` removed."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"recipe {path} not found: pass the path of a YAML recipe file")
    if os.path.abspath(path) in chain:
        raise ConfigError(f"recipe {path} names itself through its base chain: {' -> '.join(chain)}")
    with open(path, encoding="utf-8") as f:
        loaded = yaml.load(f, Loader=_Loader)
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys, got {type(loaded).__name__}")
    _refuse_renamed(_dotted_keys(loaded), str(path))
    base = loaded.pop("base", None)
    if base is None:
        return [(str(path), loaded)]
    if not isinstance(base, str):
        raise ConfigError(f"base in {path} must be the path of another recipe file, got {base!r}")
    parent = _read_recipe(os.path.join(os.path.dirname(path), base), (*chain, os.path.abspath(path)))
    return [*parent, (str(path), loaded)]


def _open_sections(defaults: dict | None, prefix: str = "") -> set[str]:
    """Dotted paths of the empty mappings in ``defaults``: open sections that accept any key."""
    found = set()
    for key, value in (defaults or {}).items():
        if isinstance(value, dict):
            found |= {prefix + str(key)} if not value else _open_sections(value, f"{prefix}{key}.")
    return found


def _merge(dst: dict, src: dict, root: dict, source: str, strict: bool, prefix: str = "") -> None:
    """Merge ``src`` into ``dst`` recursively; with ``strict``, keys absent from a non-empty section are errors."""
    closed = strict and bool(dst)  # decided before this merge adds keys to an open section
    for key, value in src.items():
        dotted = prefix + str(key)
        if closed and key not in dst:
            raise _unknown(dotted, root, source)
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value, root, source, strict, dotted + ".")
        else:
            dst[key] = copy.deepcopy(value)


def _kind(value: Any) -> str | None:
    """What an override must give for a key that holds ``value``: "number", "true or false", "list", or None (any)."""
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, (list, tuple)):
        return "list"
    return None


def _check_type(key: str, old: Any, new: Any, item: str) -> None:
    """A number, boolean or list key keeps its kind (null is always allowed): ``batch_size=abc`` is refused here."""
    kind = _kind(old)
    if new is None or kind is None or _kind(new) == kind:
        return
    example = {"number": f"{key}={old}", "true or false": f"{key}=true", "list": f"{key}=[1, 2]"}[kind]
    raise ConfigError(f"'{key}' takes a {kind}, got {new!r} in override {item!r}: e.g. {example}")


def _apply_override(cfg: dict, item: str, open_sections: set[str]) -> None:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like key.sub=value")
    _refuse_renamed([key], f"override {item!r}")
    value = parse_value(raw)
    parts = key.split(".")
    node = cfg
    for i, part in enumerate(parts):
        here = ".".join(parts[: i + 1])
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set '{key}': '{'.'.join(parts[:i])}' is a value, not a section")
        if part not in node and ".".join(parts[:i]) not in open_sections and (node or node is cfg):
            raise _unknown(here, cfg, f"override {item!r}")
        if i < len(parts) - 1:
            node = node.setdefault(part, {})
        elif isinstance(node.get(part), dict) and node[part] and not isinstance(value, dict):
            raise ConfigError(f"'{here}' is a section; set one of its keys, e.g. {here}.{next(iter(node[part]))}=...")
        else:
            _check_type(key, node.get(part), value, item)
            node[part] = value


def load_config(path: str | os.PathLike | None, overrides: Iterable[str] = (), defaults: dict | None = None) -> dict:
    """Load a run configuration.

    ``defaults`` (deep-copied) <- the files of ``path``'s ``base:`` chain (a path relative to the file naming it;
    the base's base first) <- YAML file at ``path`` (optional) <- ``overrides`` (``"optim.lr=1e-4"``,
    values typed by YAML). With ``defaults``, file keys must exist in them; overrides must always name an
    existing key, and a key holding a number, a boolean or a list takes only that kind (or null). An empty mapping
    in the defaults is an open section that accepts any key. Unknown keys and values of the wrong kind raise
    :class:`ConfigError` (listing close matches), and so do keys of :data:`RENAMED` (naming the new key); a missing
    recipe file FileNotFoundError.
    """
    cfg = copy.deepcopy(defaults) if defaults is not None else {}
    if path is not None:
        for source, loaded in _read_recipe(path):
            _merge(cfg, loaded, cfg, source, strict=defaults is not None)
    open_sections = _open_sections(defaults)
    for item in overrides:
        _apply_override(cfg, item, open_sections)
    return cfg


def save_config(cfg: dict, path: str | os.PathLike) -> None:
    """Write ``cfg`` as indented JSON, atomically."""
    atomic_write(path, (json.dumps(cfg, indent=2, default=str) + "\n").encode("utf-8"))


def check_number(
    value: Any, key: str, minimum: float, *, integer: bool = False, above: bool = False, optional: bool = False
) -> None:
    """Refuse a recipe value that is not a number of at least ``minimum`` (more than it with ``above``; a whole number
    with ``integer``; null allowed with ``optional``), naming the ``key``: ``train.batch_size=0``, an empty
    ``optim.lr=`` (YAML null) are refused here, before anything is built."""
    if value is None and optional:
        return
    wanted = f"{'a whole number' if integer else 'a number'} {'above' if above else 'at least'} {minimum}"
    wanted += " or null" if optional else ""
    if value is None:
        raise ConfigError(f"{key} has no value (an empty '{key}=' reads as null): give {wanted}")
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not (value > minimum if above else value >= minimum):
        raise ConfigError(f"{key} must be {wanted}, got {value!r}")


def check_betas(value: Any, key: str = "optim.betas") -> None:
    """Refuse Adam betas that are not two numbers in [0, 1), naming the ``key``."""
    ok = isinstance(value, (list, tuple)) and len(value) == 2
    if not ok or any(isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < 1 for b in value):
        raise ConfigError(f"{key} must be two numbers in [0, 1), e.g. [0.9, 0.98], got {value!r}")
