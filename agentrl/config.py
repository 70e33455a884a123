"""Typed configuration: dataclasses loaded from YAML plus dotted ``key=value`` overrides.

What it is: one loader for every component's config. Each component declares its own
dataclass beside its code (``TrainerConfig`` in the trainer module, ...), documenting
each field with ``option(default, help=..., ge=..., choices=...)``. What it is not: a
registry of all settings in one file.

Main hooks:
    cfg = load_config(TinyModelConfig, "run.yaml", ["model.hidden_size=64"])
    save_config(cfg, run_dir / "config.yaml")   # the resolved config, beside the outputs
    add_arguments(parser, ServeConfig); cfg = from_args(ServeConfig, parser.parse_args())

A command's flags are generated from the same dataclass (``--field-name`` for ``field_name``,
or ``option(flag=...)``), so a setting is declared once, with its default, bounds and help.
A nested section's default instance (``option(SamplingConfig(temperature=0.0))``) is what a
section given in part starts from.

Every mistake becomes a one-line ``ConfigError`` naming the dotted key, the value that
came, and what is allowed ("did you mean ...?" for misspelt keys).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import functools
import math
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from agentrl.errors import ConfigError

T = TypeVar("T")

_MISSING = dataclasses.MISSING


def option(
    default: Any = _MISSING,
    *,
    help: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: Iterable[Any] | None = None,
    flag: str | None = None,
    cli: bool = True,
) -> Any:
    """A documented, validated dataclass field. Mutable defaults are copied per instance.

    ``default`` may be a dataclass (its defaults) or an instance of one (a section whose
    defaults differ from its class's, copied per instance). ``flag``: the command-line
    spelling when it is not ``--field-name``; ``cli=False``: no flag (``add_arguments``).
    """
    meta = {"help": help, "ge": ge, "gt": gt, "le": le, "lt": lt,
            "choices": tuple(choices) if choices is not None else None, "flag": flag, "cli": cli}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    if dataclasses.is_dataclass(default) and isinstance(default, type):
        return dataclasses.field(default_factory=default, metadata=meta)
    if dataclasses.is_dataclass(default):
        return dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _default_of(f: dataclasses.Field) -> Any:
    """The value a field gets when not given (``_MISSING`` for a required one)."""
    if f.default is not _MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not _MISSING else _MISSING


# --------------------------------------------------------------------------- loading


def load_config(cls: type[T], path: str | Path | None = None, overrides: Iterable[str] = ()) -> T:
    """Build ``cls`` from an optional YAML file and ``key=value`` overrides (applied last)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist; pass a YAML file path")
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}".replace("\n", " ")) from e
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"config file {str(path)!r} must hold a mapping of keys, got {type(loaded).__name__}"
            )
        data = loaded
    return from_dict(cls, apply_overrides(data, overrides))


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``key=value`` overrides to a plain config mapping (in place; returned for chaining)."""
    for item in overrides:
        key, value = parse_override(item)
        _set_dotted(data, key, value)
    return data


def parse_override(item: str) -> tuple[str, Any]:
    """``"trainer.lr=1e-5"`` -> ``("trainer.lr", 1e-5)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. trainer.lr=1e-5)")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key; expected dotted.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key!r}: {part!r} holds a value, not a section")
        node = child
    node[parts[-1]] = value


def from_dict(cls: type[T], data: Mapping[str, Any], prefix: str = "", base: Any = None) -> T:
    """Validate ``data`` against the dataclass ``cls`` (recursively) and build it.

    Keys not in ``data`` take ``base``'s values (an instance of ``cls``), else the field's
    default; a nested section given in part starts from the field's default instance, so
    ``eval.sampling.max_new_tokens=48`` keeps ``eval.sampling``'s greedy temperature."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config key {prefix.rstrip('.') or '<root>'!r}: expected a section (mapping), "
            f"got {type(data).__name__} {data!r}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown config key {prefix + str(key)!r}{hint} "
                f"(known keys here: {', '.join(sorted(fields))})"
            )
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if base is not None:
                kwargs[name] = getattr(base, name)
            elif f.default is _MISSING and f.default_factory is _MISSING:
                raise ConfigError(f"config key {prefix + name!r} is required: {f.metadata.get('help', '')}")
            continue
        default = getattr(base, name) if base is not None else _MISSING
        if default is _MISSING and isinstance(data[name], Mapping):  # a section: from its default instance
            default = _default_of(f)
        kwargs[name] = _coerce(hints[name], data[name], prefix + name, f.metadata, default)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"config section {prefix.rstrip('.') or '<root>'!r}: {e}") from e


def _coerce(tp: Any, value: Any, key: str, meta: Mapping[str, Any], default: Any = _MISSING) -> Any:
    """``value`` as a ``tp``; a section (dataclass) given in part starts from ``default``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(arg, value, key, meta, default)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"config key {key!r}: got {value!r}, "
                          f"expected one of {[_type_name(a) for a in args]}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value if value is not None else {}, key + ".",
                         base=default if isinstance(default, tp) else None)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"config key {key!r}: got {value!r}, expected one of {list(args)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key {key!r}: expected a list, got {type(value).__name__} {value!r}")
        item_tp = args[0] if args else Any
        return [_coerce(item_tp, v, f"{key}[{i}]", {}) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"config key {key!r}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key!r}: expected true or false, got {value!r}")
        return _check_range(value, key, meta)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key!r}: expected an integer, got {type(value).__name__} {value!r}")
        return _check_range(value, key, meta)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r}: expected a number, got {type(value).__name__} {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"config key {key!r}: expected a finite number, got {value!r}")
        return _check_range(float(value), key, meta)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"config key {key!r}: expected a string, got {type(value).__name__} {value!r}")
        return _check_range(str(value), key, meta)
    return value


def _check_range(value: Any, key: str, meta: Mapping[str, Any]) -> Any:
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"config key {key!r}: got {value!r}, expected one of {list(choices)}{hint}")
    for bound, ok, word in (
        ("ge", lambda v, b: v >= b, ">="),
        ("gt", lambda v, b: v > b, ">"),
        ("le", lambda v, b: v <= b, "<="),
        ("lt", lambda v, b: v < b, "<"),
    ):
        b = meta.get(bound)
        if b is not None and not ok(value, b):
            raise ConfigError(f"config key {key!r}: got {value!r}, expected a value {word} {b}")
    return value


def choices_of(tp: Any, meta: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The allowed values of an ``option``: its ``choices``, or a ``Literal`` type's values."""
    if meta.get("choices") is not None:
        return meta["choices"]
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else None


def bound_problem(value: Any, tp: Any, meta: Mapping[str, Any]) -> str | None:
    """What ``value`` breaks of an ``option``'s choices and bounds (``"must be >= 16"``), or None.
    None is within every bound (a field that may be None says so in its type)."""
    if value is None:
        return None
    choices = choices_of(tp, meta)
    if choices is not None:
        return None if value in choices else f"must be one of {list(choices)}"
    for bound, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                            ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        b = meta.get(bound)
        if b is not None and not ok(value, b):
            return f"must be {word} {b}"
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def check_options(obj: Any) -> None:
    """Raise ``ValueError`` naming the first field of the dataclass ``obj`` outside its
    ``option``'s choices or bounds (for records built in code rather than loaded as config)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        problem = bound_problem(value, hints[f.name], f.metadata)
        if problem:
            raise ValueError(f"{f.name} {problem}, got {value!r}")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


# --------------------------------------------------------------------------- saving


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain dict of the (possibly nested) config dataclass."""
    return dataclasses.asdict(cfg)


def save_config(cfg: Any, path: str | Path) -> Path:
    """Write the resolved config as YAML (keeps the field order of the dataclasses)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    return path


def describe(cls: type, defaults: Any = None) -> list[tuple[str, str, Any, str]]:
    """(dotted key, type, default, help) for every field, nested sections included (their
    defaults those of the section's default instance, or of ``defaults``, an instance of ``cls``)."""
    rows: list[tuple[str, str, Any, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        default = getattr(defaults, f.name) if defaults is not None else _default_of(f)
        if dataclasses.is_dataclass(tp):
            nested = default if isinstance(default, tp) else None
            rows += [(f"{f.name}.{k}", t, d, h) for k, t, d, h in describe(tp, nested)]
            continue
        rows.append((f.name, _type_name(tp) if not typing.get_args(tp) else str(tp),
                     "<required>" if default is _MISSING else default, f.metadata.get("help", "")))
    return rows


# --------------------------------------------------------------------------- command-line flags


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of the dataclass ``cls``: ``--field-name`` (or ``option(flag=...)``),
    its type from the annotation (``int``, ``float``, ``str``, ``X | None``, a ``Literal`` or
    ``choices`` as the allowed values; a ``bool`` is a switch: ``--x`` when it defaults to
    False, ``--x/--no-x`` otherwise), its help the option's, with the default. A field
    without a default is a required flag; ``option(cli=False)`` leaves a field out.
    ``parser`` may be an argument group. Build the config with ``from_args``, which validates
    like a config file does."""
    hints = _hints(cls)
    for f in _flag_fields(cls):
        tp, meta = hints[f.name], f.metadata
        kind, choices = _flag_type(cls, f.name, tp)
        default = _default_of(f)
        help_ = meta.get("help", "").replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f.name}
        if kind is bool:
            kwargs["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            choices = choices_of(tp, meta) or choices
            if choices is not None:
                kwargs["choices"] = choices
        if default is _MISSING:
            kwargs["required"] = True
        else:
            kwargs["default"] = default
            if default not in (None, "") and kind is not bool:
                help_ += f" (default: {default})".replace("%", "%%")
        parser.add_argument(_flag_of(f), help=help_, **kwargs)


def from_args(cls: type[T], args: argparse.Namespace, **extra: Any) -> T:
    """The ``cls`` the flags of ``add_arguments(parser, cls)`` in ``args`` give, ``extra``
    (field values the command computes, e.g. a key from the environment) on top; validated
    by ``from_dict``, so a value out of bounds is the one-line ``ConfigError`` naming its key."""
    data = {f.name: getattr(args, f.name) for f in _flag_fields(cls)}
    return from_dict(cls, {**data, **extra})


def _flag_fields(cls: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init and f.metadata.get("cli", True)]


def _flag_of(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def _flag_type(cls: type, name: str, tp: Any) -> tuple[type, tuple[Any, ...] | None]:
    """The flag's argparse type (and a ``Literal``'s values) for a field annotated ``tp``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        tp = args[0] if len(args) == 1 else tp
    if typing.get_origin(tp) is typing.Literal:
        values = typing.get_args(tp)
        return type(values[0]), values
    if tp in (bool, int, float, str):
        return tp, None
    raise TypeError(f"{cls.__name__}.{name}: a field of type {tp} has no command-line flag; "
                    "declare it with option(..., cli=False)")
