"""The one name -> object registry used for every pluggable kind of thing.

One ``Registry`` instance per kind: advantage estimators, policy losses, loss aggregations, KL
estimators, rollout backends, environment families (an entry carries the family's experts and
example action), answer parsers, prompt styles, model families. Config validation reads
``names()`` / ``in`` from these instances, so adding an entry is the only step needed for the
config to accept its name.

Two ways to add an entry::

    ESTIMATORS = Registry("advantage estimator")

    @ESTIMATORS.register("grpo")          # eager: the object is at hand
    def grpo(...): ...

    FAMILIES.register_lazy("babyai", "environments.babyai.family:FAMILY")   # lazy

A lazy entry names ``"package.module:attribute"`` (the attribute may be dotted,
``"pkg.mod:Class.from_config"``); the module is imported on the first ``get(name)``, so listing the
names never imports a heavy dependency (JAX, a JVM bridge, a browser driver).

Lookups are by normalised name: by default ``str.strip`` only; a registry built with
``normalize=snake_case`` also maps ``"Token-Mean"`` to ``"token_mean"``. An unknown name raises
``UnknownNameError`` (a ``ValueError``) with one line naming the kind, the known names and the
closest match::

    unknown advantage estimator 'grop'; known: gae, grpo, rloo; did you mean 'grpo'?

Standard library only: this module is imported by ``environments/`` and ``agentrl_jax/`` alike.
"""

from __future__ import annotations

import difflib
import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

__all__ = ["DuplicateNameError", "Registry", "UnknownNameError", "did_you_mean", "snake_case"]

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name that is not registered. ``kind``, ``name`` and ``known`` (sorted) are attributes."""

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind, self.name, self.known = kind, name, list(known)
        listing = ", ".join(self.known) if self.known else "(none registered)"
        super().__init__(f"unknown {kind} {name!r}; known: {listing}{did_you_mean(name, self.known)}")


class DuplicateNameError(ValueError):
    """A second registration under a name that is already taken (pass ``replace=True`` to mean it)."""


def did_you_mean(name: str, known: list[str] | tuple[str, ...]) -> str:
    """``"; did you mean 'grpo'?"`` for the closest of ``known`` (difflib ratio >= 0.6), else ``""``."""
    close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
    if not close:
        close = difflib.get_close_matches(str(name).lower(), [k.lower() for k in known], n=1, cutoff=0.6)
        close = [k for k in known if close and k.lower() == close[0]][:1]
    return f"; did you mean {close[0]!r}?" if close else ""


def snake_case(name: str) -> str:
    """``"Seq-Mean-Token-Sum"`` -> ``"seq_mean_token_sum"`` (strip, lower case, ``-`` -> ``_``)."""
    return str(name).strip().lower().replace("-", "_")


def _strip(name: str) -> str:
    return str(name).strip()


class _Lazy:
    """A not-yet-imported entry: ``"module:attribute"``."""

    __slots__ = ("target",)

    def __init__(self, target: str):
        module, sep, attribute = target.partition(":")
        if not sep or not module or not attribute:
            raise ValueError(f"lazy target must be 'package.module:attribute', got {target!r}")
        self.target = target

    def __repr__(self) -> str:
        return f"<lazy {self.target}>"


class Registry(Generic[T]):
    """Names -> objects of one kind, with eager and lazy (import-on-first-use) entries.

    kind: words for messages ("advantage estimator", "environment family").
    normalize: maps a name to its key (default: strip surrounding spaces); ``snake_case`` makes
      lookups case- and dash-insensitive.
    expected: if given, every object (eager, or lazy once imported) must be an instance of it,
      else ``TypeError``.

    >>> R = Registry("thing")
    >>> @R.register("foo")
    ... def foo(): ...
    >>> R.get("foo") is foo, "foo" in R, R.names()
    (True, True, ['foo'])
    """

    def __init__(
        self,
        kind: str,
        *,
        normalize: Callable[[str], str] | None = None,
        expected: type | tuple[type, ...] | None = None,
    ):
        self.kind = kind
        self._normalize = normalize or _strip
        self._expected = expected
        self._entries: dict[str, Any] = {}  # key -> object or _Lazy
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ adding entries
    def key(self, name: str) -> str:
        """The normalised key under which ``name`` is (or would be) stored."""
        if not isinstance(name, str):
            raise TypeError(f"{self.kind} name must be a string, got {type(name).__name__}")
        key = self._normalize(name)
        if not key:
            raise ValueError(f"{self.kind} name must not be empty")
        return key

    @overload
    def register(self, name: str, obj: None = None, *, replace: bool = False) -> Callable[[T], T]: ...
    @overload
    def register(self, name: str, obj: T, *, replace: bool = False) -> T: ...

    def register(self, name, obj=None, *, replace=False):
        """Register ``obj`` under ``name`` and return it; without ``obj``, a decorator doing so.

        Registering a name that is already taken raises ``DuplicateNameError`` unless it is the
        very same object again (re-imports are harmless) or ``replace=True``.
        """
        key = self.key(name)

        def _add(item: T) -> T:
            self._check_type(key, item)
            with self._lock:
                old = self._entries.get(key)
                if key in self._entries and old is not item and not replace:
                    raise DuplicateNameError(
                        f"{self.kind} {key!r} is already registered ({old!r}); pass replace=True to replace it")
                self._entries[key] = item
            return item

        return _add if obj is None else _add(obj)

    def register_lazy(self, name: str, target: str, *, replace: bool = False) -> None:
        """Register ``name`` as ``"package.module:attribute"``, imported on the first ``get``."""
        key = self.key(name)
        lazy = _Lazy(target)
        with self._lock:
            old = self._entries.get(key)
            same = isinstance(old, _Lazy) and old.target == target
            if key in self._entries and not same and not replace:
                raise DuplicateNameError(
                    f"{self.kind} {key!r} is already registered ({old!r}); pass replace=True to replace it")
            self._entries[key] = lazy

    def unregister(self, name: str) -> None:
        """Remove ``name`` (``UnknownNameError`` if absent). For tests and plug-in teardown."""
        key = self.key(name)
        with self._lock:
            if key not in self._entries:
                raise UnknownNameError(self.kind, name, self.names())
            del self._entries[key]

    # ------------------------------------------------------------------ lookups
    def get(self, name: str) -> T:
        """The object registered as ``name``, importing a lazy entry's module on first use.

        Raises ``UnknownNameError`` for an unknown name, ``ImportError`` (the original as its
        cause) when a lazy entry's module or attribute cannot be imported.
        """
        key = self._normalize(name) if isinstance(name, str) else None
        with self._lock:
            if key is None or key not in self._entries:
                raise UnknownNameError(self.kind, str(name), self.names())
            entry = self._entries[key]
        if not isinstance(entry, _Lazy):
            return entry
        # import outside the lock: the module may itself register entries (here or elsewhere)
        obj = self._load(key, entry)
        self._check_type(key, obj, entry.target)
        with self._lock:
            if self._entries.get(key) is entry:
                self._entries[key] = obj
        return obj

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def names(self) -> list[str]:
        """All registered names (eager and lazy), sorted. Imports nothing."""
        with self._lock:
            return sorted(self._entries)

    def is_loaded(self, name: str) -> bool:
        """Whether ``name`` is registered and its object is at hand (eager or already imported)."""
        key = self._normalize(name)
        entry = self._entries.get(key)
        return key in self._entries and not isinstance(entry, _Lazy)

    def target(self, name: str) -> str | None:
        """The ``"module:attribute"`` of a lazy entry not yet imported, else ``None``."""
        entry = self._entries.get(self._normalize(name))
        return entry.target if isinstance(entry, _Lazy) else None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._normalize(name) in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"

    # ------------------------------------------------------------------ internals
    def _load(self, key: str, entry: _Lazy) -> Any:
        module_name, _, attribute = entry.target.partition(":")
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as error:
            message = f"{self.kind} {key!r} needs module {module_name!r}, which could not be imported: {error}"
            try:  # keep the class (ModuleNotFoundError) so callers can tell a missing dependency
                wrapped = type(error)(message, name=error.name, path=error.path)
            except TypeError:  # a subclass with another signature
                wrapped = ImportError(message, name=error.name, path=error.path)
            raise wrapped from error
        for part in attribute.split("."):
            try:
                obj = getattr(obj, part)
            except AttributeError as error:
                raise ImportError(
                    f"{self.kind} {key!r}: {entry.target} does not exist ({error})", name=module_name) from error
        return obj

    def _check_type(self, key: str, obj: Any, target: str | None = None) -> None:
        if self._expected is not None and not isinstance(obj, self._expected):
            where = f" ({target})" if target else ""
            expected = (self._expected.__name__ if isinstance(self._expected, type)
                        else " or ".join(t.__name__ for t in self._expected))
            raise TypeError(f"{self.kind} {key!r}{where} is a {type(obj).__name__}, expected {expected}")
