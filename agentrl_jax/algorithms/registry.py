"""A tiny name -> function registry used for advantage estimators, policy losses,
loss aggregation modes and KL estimators.

Names are normalised (lower case, ``-`` -> ``_``) so that verl-style config strings
such as ``"token-mean"`` or ``"seq-mean-token-sum"`` resolve to the same entry as
``"token_mean"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


def normalize_name(name: str) -> str:
    """``"Seq-Mean-Token-Sum"`` -> ``"seq_mean_token_sum"``."""
    return str(name).strip().lower().replace("-", "_")


class Registry(Mapping, Generic[F]):
    """Read-only mapping ``name -> function`` with a ``register`` decorator.

    >>> R = Registry("thing")
    >>> @R.register("foo")
    ... def foo(): ...
    >>> R.get("FOO") is foo
    True
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str, fn: F | None = None, *, overwrite: bool = False):
        """Register ``fn`` under ``name``; usable as ``@R.register("name")``."""
        key = normalize_name(name)

        def _do(f: F) -> F:
            if key in self._fns and self._fns[key] is not f and not overwrite:
                raise ValueError(f"{self.kind} {key!r} is already registered")
            self._fns[key] = f
            return f

        return _do(fn) if fn is not None else _do

    def get(self, name: str, default=None) -> F:  # type: ignore[override]
        """Look a function up by name; raises ``KeyError`` listing the choices."""
        key = normalize_name(name)
        if key in self._fns:
            return self._fns[key]
        if default is not None:
            return default
        raise KeyError(f"unknown {self.kind} {name!r}; choices: {sorted(self._fns)}")

    def __getitem__(self, name: str) -> F:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and normalize_name(name) in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(self._fns)

    def __len__(self) -> int:
        return len(self._fns)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._fns)})"
