"""Typed config sections: frozen dataclasses whose fields carry their one default and their check.

A section is a ``@dataclasses.dataclass(frozen=True)`` subclass of :class:`Section` whose fields
are declared with :func:`setting`::

    @dataclasses.dataclass(frozen=True)
    class TrainConfig(Section):
        total_steps: int = setting(300, ge=0)
        eval_min_scored: float = setting(0.9, ge=0, le=1)

Constructing a section checks every field against its annotation and its bounds
(:meth:`Section.problems`) and raises :class:`SectionError` carrying one line per bad field
(``"train.total_steps: must be an integer >= 0 (got -1)"``), all of them at once.
:meth:`Section.from_mapping` builds a section from a plain mapping (a config file's section) and
returns the problems instead, adding one line per unknown key with a "did you mean" (``difflib``).

Supported annotations: ``int``, ``float`` (an ``int`` is accepted and converted), ``bool``,
``str``, ``tuple[T, ...]`` (a list or tuple), ``Mapping``/``dict`` (any mapping, kept as a plain
``dict``), unions with ``None`` and ``str | tuple[str, ...]``; ``Any`` is not checked.
Standard library only: both ``agentrl_jax`` and tools may import it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Callable, Iterable, Mapping

from agentrl_common.registry import did_you_mean


class SectionError(ValueError):
    """A section with bad values; ``problems`` holds one line per bad field."""

    def __init__(self, problems: Iterable[str]):
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


def setting(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None,
            ge: float | None = None, gt: float | None = None, le: float | None = None,
            choices: Iterable[str] | Callable[[], Iterable[str]] | None = None,
            kind: str = "value", normalize: Callable[[str], str] | None = None,
            what: str | None = None, check: Callable[[Any], str | None] | None = None,
            help: str | None = None) -> Any:
    """A section field: its default (``factory`` for a mutable one) and its check.

    ``ge`` / ``gt`` / ``le``: bounds of a number; ``choices``: the known names of a string (or
    a function returning them, read when checked: a registry's ``names``), compared after
    ``normalize``, reported as ``unknown <kind> 'x'; known: a, b``; ``what``: the wording of a
    number's range (default from the bounds); ``check``: ``value -> problem or None`` replacing
    the type and bound checks (a value with its own rules, e.g. a sampling parameter);
    ``help``: one line saying what the setting does (a generated command line's ``--help``)."""
    meta = {"ge": ge, "gt": gt, "le": le, "choices": choices, "kind": kind,
            "normalize": normalize, "what": what, "check": check, "help": help}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def close_names(word: str, names: Iterable[str]) -> list[str]:
    """The names ``word`` most likely means, best first: the closest by ``difflib``, else
    those whose initials spell it (``lr`` -> ``learning_rate``), else those it begins."""
    names = list(names)
    close = difflib.get_close_matches(word, names, n=1)
    if close:
        return close
    initials = [n for n in names if "_" in n and "".join(p[:1] for p in n.split("_")) == word]
    return initials or [n for n in names if len(word) >= 2 and n.startswith(word)][:1]


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: Any) -> bool:
    return (isinstance(x, (int, float)) and not isinstance(x, bool)
            and math.isfinite(float(x)))


def _bounds_text(meta: Mapping[str, Any]) -> str:
    ge, gt, le = meta["ge"], meta["gt"], meta["le"]
    low = ge if ge is not None else gt
    if low is not None and le is not None:
        return f"in {'[' if ge is not None else '('}{low:g}, {le:g}]"
    if ge is not None:
        return f">= {ge:g}"
    if gt is not None:
        return f"> {gt:g}"
    if le is not None:
        return f"<= {le:g}"
    return ""


def _in_bounds(x: float, meta: Mapping[str, Any]) -> bool:
    return ((meta["ge"] is None or x >= meta["ge"]) and (meta["gt"] is None or x > meta["gt"])
            and (meta["le"] is None or x <= meta["le"]))


def _split_optional(annotation: Any) -> tuple[Any, bool]:
    """(the annotation without ``None``, whether ``None`` is allowed)."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(args) < len(typing.get_args(annotation))
        return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), optional
    return annotation, False


def _matches(value: Any, annotation: Any) -> tuple[bool, Any]:
    """(does ``value`` have the type ``annotation``, the value converted: int -> float,
    list -> tuple, mapping -> dict)."""
    if annotation is Any:
        return True, value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return is_int(value), value
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, float(value) if ok else value
    if annotation is str:
        return isinstance(value, str), value
    origin = typing.get_origin(annotation) or annotation
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(annotation):
            ok, converted = _matches(value, option)
            if ok:
                return True, converted
        return False, value
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)):
            return False, value
        args = typing.get_args(annotation)
        item = args[0] if args else Any
        items = [_matches(v, item) for v in value]
        return all(ok for ok, _ in items), tuple(v for _, v in items)
    if origin in (dict, Mapping, typing.Mapping) or annotation in (dict, Mapping):
        if hasattr(value, "to_dict"):  # an ml_collections.ConfigDict
            value = value.to_dict()
        return isinstance(value, Mapping), dict(value) if isinstance(value, Mapping) else value
    return isinstance(value, origin) if isinstance(origin, type) else True, value


def _type_text(annotation: Any) -> str:
    annotation, optional = _split_optional(annotation)
    text = {int: "an integer", float: "a finite number", bool: "True or False",
            str: "a string"}.get(annotation)
    if text is None:
        origin = typing.get_origin(annotation) or annotation
        if origin is tuple:
            args = typing.get_args(annotation)
            text = f"a sequence of {_type_text(args[0]).split(' ', 1)[-1]}s" if args else \
                "a sequence"
        elif origin in (typing.Union, types.UnionType):
            text = " or ".join(_type_text(a) for a in typing.get_args(annotation))
        elif origin in (dict, Mapping, typing.Mapping):
            text = "a mapping (a section)"
        else:
            text = getattr(annotation, "__name__", str(annotation))
    return text + (" or None" if optional else "")


class Section:
    """Base of the typed config sections (module docstring). Subclasses are frozen dataclasses;
    ``_extra_problems(prefix, bad)`` adds the checks that span several fields (``bad``: the
    fields already reported, whose values must not be trusted)."""

    #: the section's dotted name in the whole config ("train", "learner", ...)
    PREFIX: typing.ClassVar[str] = ""

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise SectionError(problems)

    # ------------------------------------------------------------------ checks
    def problems(self) -> list[str]:
        """One line per bad field, ``"<PREFIX>.<field>: <what is wrong> (got <value>)"``."""
        prefix = self.PREFIX
        hints = typing.get_type_hints(type(self))
        out: list[str] = []
        bad: set[str] = set()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Section) or not f.init:  # a nested section checked itself
                continue
            problem, converted = self._field_problem(f, hints[f.name], value)
            if problem is not None:
                out.append(f"{prefix}.{f.name}: {problem}" if prefix else f"{f.name}: {problem}")
                bad.add(f.name)
            elif converted is not value:
                object.__setattr__(self, f.name, converted)
        out.extend(self._extra_problems(prefix, bad))
        return out

    @staticmethod
    def _field_problem(f: dataclasses.Field, annotation: Any, value: Any
                       ) -> tuple[str | None, Any]:
        meta = f.metadata or {}
        if meta.get("check") is not None:
            return meta["check"](value), value
        inner, optional = _split_optional(annotation)
        if value is None:
            return (None, None) if optional else (f"must be {_type_text(annotation)} (got None)",
                                                  value)
        ok, converted = _matches(value, inner)
        if inner is int:
            bounds = _bounds_text(meta) if meta else ""
            if meta.get("ge") is not None and meta.get("le") is not None:
                bounds = f"in {meta['ge']:g}..{meta['le']:g}"
            if not ok or not _in_bounds(value, meta):
                return f"must be an integer{' ' + bounds if bounds else ''} (got {value!r})", value
            return None, value
        if inner is float:
            what = meta.get("what") or _bounds_text(meta)
            if not ok or not math.isfinite(converted) or not _in_bounds(converted, meta):
                return f"must be a finite number{' ' + what if what else ''} (got {value!r})", value
            return None, converted
        if not ok:
            return f"must be {_type_text(annotation)} (got {value!r})", value
        choices = meta.get("choices")
        if choices is not None and isinstance(converted, str):
            known = sorted(set(choices() if callable(choices) else choices))
            norm = meta.get("normalize") or (lambda s: s)
            if norm(converted) not in {norm(k) for k in known}:
                hint = did_you_mean(converted, known)
                return (f"unknown {meta['kind']} {converted!r}; known: {', '.join(known)}{hint}",
                        value)
        return None, converted

    def _extra_problems(self, prefix: str, bad: set[str]) -> list[str]:
        return []

    # ------------------------------------------------------------------ construction
    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.init]

    @classmethod
    def unknown_key_problems(cls, values: Mapping[str, Any], prefix: str) -> list[str]:
        """One line per key of ``values`` that is no field, with the closest field name."""
        known = cls.field_names()
        out = []
        for key in values:
            if key in known:
                continue
            where = f"{prefix}.{key}" if prefix else key
            close = close_names(str(key), known)
            hint = (f"did you mean {prefix + '.' if prefix else ''}{close[0]}?" if close else
                    f"{prefix or 'the config'} has: {', '.join(sorted(known))}")
            out.append(f"{where}: no such key ({hint})")
        return out

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> tuple[Any, list[str]]:
        """(the section of ``values``, []) or (None, one line per problem): unknown keys and
        every bad field. Missing keys take their default."""
        prefix = cls.PREFIX
        values = dict(values or {})
        problems = cls.unknown_key_problems(values, prefix)
        known = {k: v for k, v in values.items() if k in cls.field_names()}
        try:
            section = cls(**known)
        except SectionError as error:
            return None, problems + error.problems
        return (None, problems) if problems else (section, [])

    def to_dict(self) -> dict[str, Any]:
        """Plain values (tuples stay tuples, sections become dicts)."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = (value.to_dict() if isinstance(value, Section)
                           else dict(value) if isinstance(value, Mapping) else value)
        return out

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)
