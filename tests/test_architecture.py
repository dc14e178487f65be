"""The floors of docs/ARCHITECTURE.md, checked on the source: every module is parsed with ``ast``
and its imports (module level and inside functions; ``from . import x`` resolved) are compared
with what its floor may import. Also: no module in ``agentrl_jax/`` is over the line limit.

Nothing is imported or run, so this is fast and sees lazy imports too."""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
LIBRARY = ("agentrl_common", "agentrl_jax", "environments")
TOP = ("launch", "benchmarks", "experiments", "notebooks")
MAX_LINES = 500


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module, dotted (for ``from m import a``: ``m.a`` and ``m``)
    line: int
    top_level: bool  # executed when the module is imported (not inside a function)

    def where(self) -> str:
        return f"{self.module}:{self.line} imports {self.target}"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path, name: str | None = None) -> list[Import]:
    """Every import statement of the file ``path`` (module ``name``, default from its path)."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), filename=str(path))
    # nodes inside function bodies are not top-level even under a module-level if / try
    in_function = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(node):
                if sub is not node:
                    in_function.add(id(sub))
    found = []
    for node in ast.walk(tree):
        top = id(node) not in in_function
        if isinstance(node, ast.Import):
            found += [Import(name, a.name, node.lineno, top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append(Import(name, module, node.lineno, top))
            found += [Import(name, f"{module}.{a.name}", node.lineno, top) for a in node.names
                      if a.name != "*"]
    return found


def _files(*roots: str) -> list[pathlib.Path]:
    out = []
    for root in roots:
        base = REPO / root
        out += sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    return out


ALL = {p: _imports(p) for p in _files(*LIBRARY)}


def _within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def _violations(importer: str, forbidden: tuple[str, ...], *, top_level_only: bool = False,
                allowed: tuple[str, ...] = (),
                modules: dict[pathlib.Path, list[Import]] | None = None) -> list[str]:
    """Imports made by modules under ``importer`` (of ``modules``, default the library) of
    anything under ``forbidden`` (except under ``allowed``)."""
    bad = []
    for imports in (ALL if modules is None else modules).values():
        for imp in imports:
            if not _within(imp.module, importer) or (top_level_only and not imp.top_level):
                continue
            if any(_within(imp.target, f) for f in forbidden) and not any(
                    _within(imp.target, a) for a in allowed):
                bad.append(imp.where())
    return sorted(set(bad))


RULES = {
    "agentrl_common imports neither agentrl_jax, environments nor jax":
        ("agentrl_common", ("agentrl_jax", "environments", "jax", "flax", "optax"), False, ()),
    "environments never imports agentrl_jax":
        ("environments", ("agentrl_jax",), False, ()),
    "algorithms imports nothing else in agentrl_jax but the kernels":
        ("agentrl_jax.algorithms", ("agentrl_jax",), False,
         ("agentrl_jax.algorithms", "agentrl_jax.kernels")),
    "kernels import nothing else in agentrl_jax":
        ("agentrl_jax.kernels", ("agentrl_jax", "environments"), False, ("agentrl_jax.kernels",)),
    "learner does not import rollout":
        ("agentrl_jax.learner", ("agentrl_jax.rollout",), False, ()),
    "rollout does not import learner":
        ("agentrl_jax.rollout", ("agentrl_jax.learner",), False, ()),
    "rollout and learner import nothing above them":
        ("agentrl_jax.rollout", ("agentrl_jax.agent", "agentrl_jax.training", "agentrl_jax.viewer",
                                 "environments"), False, ()),
    "learner imports nothing above it":
        ("agentrl_jax.learner", ("agentrl_jax.agent", "agentrl_jax.training", "agentrl_jax.viewer",
                                 "environments"), False, ()),
    "models and sharding import only each other (and algorithms: none)":
        ("agentrl_jax.models", ("agentrl_jax.learner", "agentrl_jax.rollout", "agentrl_jax.agent",
                                "agentrl_jax.training", "agentrl_jax.viewer",
                                "agentrl_jax.algorithms", "environments"), False, ()),
    "sharding imports nothing above it":
        ("agentrl_jax.sharding", ("agentrl_jax.learner", "agentrl_jax.rollout", "agentrl_jax.agent",
                                  "agentrl_jax.training", "agentrl_jax.viewer", "agentrl_jax.models",
                                  "agentrl_jax.algorithms", "environments"), False, ()),
    "agent does not import jax at module level":
        ("agentrl_jax.agent", ("jax", "flax", "optax"), True, ()),
    "the rollout backend contract imports no rollout room above it":
        ("agentrl_jax.rollout.contract", ("agentrl_jax.rollout.backends", "agentrl_jax.rollout.engine",
                                          "agentrl_jax.rollout.servers"), False, ()),
    "the engine and the servers do not import the backend implementations":
        ("agentrl_jax.rollout.engine", ("agentrl_jax.rollout.backends",), False, ()),
    "the servers do not import the backend implementations":
        ("agentrl_jax.rollout.servers", ("agentrl_jax.rollout.backends",), False, ()),
    "agent does not import the training loop, the learner or the engine":
        ("agentrl_jax.agent", ("agentrl_jax.training", "agentrl_jax.learner",
                               "agentrl_jax.rollout.engine", "agentrl_jax.rollout.servers"),
         False, ()),
}


#: the rooms of ``training/`` (floor 5), bottom first: each imports only the rooms before it, and
#: the rooms of one row never import each other (docs/ARCHITECTURE.md)
TRAINING_FLOORS = (
    ("agentrl_jax.training.config",),
    ("agentrl_jax.training.evaluation",),
    ("agentrl_jax.training.outputs",),
    ("agentrl_jax.training.runtime",),
    ("agentrl_jax.training.preflight",),
    ("agentrl_jax.training.rl", "agentrl_jax.training.jobs"),
)


def training_floor_rules() -> dict[str, tuple[str, tuple[str, ...], bool, tuple[str, ...]]]:
    """One rule per room of ``training/``: no import of a room above it or beside it."""
    rules = {}
    for level, row in enumerate(TRAINING_FLOORS):
        above = tuple(room for later in TRAINING_FLOORS[level + 1:] for room in later)
        for room in row:
            beside = tuple(other for other in row if other != room)
            name = room.rpartition(".")[2]
            rules[f"training/{name} imports no room of training above or beside it"] = (
                room, above + beside, False, ())
    return rules


RULES.update(training_floor_rules())


@pytest.mark.parametrize("rule", sorted(RULES))
def test_floor(rule):
    importer, forbidden, top_level_only, allowed = RULES[rule]
    assert _violations(importer, forbidden, top_level_only=top_level_only, allowed=allowed) == []


@pytest.mark.parametrize("importer", LIBRARY)
def test_library_never_imports_the_top_floor(importer):
    assert _violations(importer, TOP) == []


def test_backend_contract_is_light():
    """Actor workers import ``rollout.contract``: it imports nothing of the library but
    ``rollout.sampling_limits`` and ``agentrl_common``, and at module level no JAX, NumPy,
    aiohttp or pydantic."""
    bad = []
    for imp in _imports(REPO / "agentrl_jax/rollout/contract.py"):
        root = imp.target.split(".")[0]
        if root in ("agentrl_jax", "environments") and imp.target not in (
                "agentrl_jax.rollout", "agentrl_jax.rollout.sampling_limits"):
            bad.append(imp.where())
        elif imp.top_level and root in ("jax", "flax", "numpy", "aiohttp", "pydantic"):
            bad.append(imp.where())
    assert bad == []


def test_every_training_module_is_in_a_room():
    """``training/`` holds its modules in the rooms of ``TRAINING_FLOORS`` (none loose beside
    ``__init__``), so no module escapes the rules above, and every room is on the plan."""
    rooms = {room for row in TRAINING_FLOORS for room in row}
    loose = sorted(m for m in MODULES if _within(m, "agentrl_jax.training")
                   and m != "agentrl_jax.training" and not any(_within(m, r) for r in rooms))
    assert loose == []
    assert all(room in MODULES for room in rooms)  # each room is a package with an __init__


def test_the_training_rules_see_a_planted_upward_or_sideways_import(tmp_path):
    """The config's sections importing the RL loop (lazily) and a job importing the trainer are
    reported; the RL loop importing the config is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from agentrl_jax.training.rl import loop\n")
    job = tmp_path / "job.py"
    job.write_text("from agentrl_jax.training.rl.trainer import Trainer\n")
    fine = tmp_path / "fine.py"
    fine.write_text("from agentrl_jax.training.config.sections import RunConfig\n")
    planted = {probe: _imports(probe, "agentrl_jax.training.config.sections"),
               job: _imports(job, "agentrl_jax.training.jobs.job"),
               fine: _imports(fine, "agentrl_jax.training.rl.fine")}
    found = []
    for importer, forbidden, top_level_only, allowed in training_floor_rules().values():
        found += _violations(importer, forbidden, top_level_only=top_level_only,
                             allowed=allowed, modules=planted)
    assert sorted(set(found)) == [
        "agentrl_jax.training.config.sections:2 imports agentrl_jax.training.rl",
        "agentrl_jax.training.config.sections:2 imports agentrl_jax.training.rl.loop",
        "agentrl_jax.training.jobs.job:1 imports agentrl_jax.training.rl.trainer",
        "agentrl_jax.training.jobs.job:1 imports agentrl_jax.training.rl.trainer.Trainer"]


PALLAS = "jax.experimental.pallas"


def kernels_outside_kernels(modules: dict[pathlib.Path, list[Import]]) -> list[str]:
    """Library modules outside ``agentrl_jax.kernels`` that import Pallas (a ``pallas_call``
    needs ``jax.experimental.pallas``, and so does a library kernel such as ``mha``)."""
    return sorted({imp.where() for imports in modules.values() for imp in imports
                   if _within(imp.target, PALLAS)
                   and not _within(imp.module, "agentrl_jax.kernels")})


def test_the_kernels_live_in_one_place():
    """Every Pallas kernel is in ``agentrl_jax/kernels/``: no other library module imports
    Pallas or calls ``pallas_call``."""
    assert kernels_outside_kernels(ALL) == []
    calls = sorted(str(p.relative_to(REPO)) for p in ALL if "pallas_call" in p.read_text()
                   and not _within(_module_name(p), "agentrl_jax.kernels")
                   and any(isinstance(n, ast.Attribute) and n.attr == "pallas_call"
                           for n in ast.walk(ast.parse(p.read_text()))))
    assert calls == []


def test_the_kernel_check_sees_a_lazy_pallas_import(tmp_path):
    """A kernel written outside ``kernels/``, with Pallas imported inside a function, is found;
    the same module under ``kernels/`` is not."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f(x):\n"
                     "    from jax.experimental import pallas as pl\n"
                     "    return pl.pallas_call(None, out_shape=x)(x)\n")
    outside = {probe: _imports(probe, "agentrl_jax.models.probe")}
    inside = {probe: _imports(probe, "agentrl_jax.kernels.probe")}
    assert kernels_outside_kernels(outside) == ["agentrl_jax.models.probe:2 imports "
                                                "jax.experimental.pallas"]
    assert kernels_outside_kernels(inside) == []


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """The parser resolves relative imports and marks imports inside functions as not
    top-level, and those under a module-level ``try`` as top-level (the rules rely on both)."""
    probe = tmp_path / "probe.py"
    probe.write_text("import os\n"
                     "from . import chat\n"
                     "from ..rollout.backends import base\n"
                     "def f():\n"
                     "    import jax\n"
                     "    from agentrl_jax.learner import learner\n"
                     "try:\n"
                     "    import numpy\n"
                     "except ImportError:\n"
                     "    pass\n")
    found = {(i.target, i.top_level) for i in _imports(probe, "agentrl_jax.agent.probe")}
    assert ("agentrl_jax.agent.chat", True) in found
    assert ("agentrl_jax.rollout.backends.base", True) in found
    assert ("jax", False) in found and ("agentrl_jax.learner.learner", False) in found
    assert ("numpy", True) in found and ("os", True) in found
    # and the rules see real imports: the agent's lazy ones of the environments' client
    assert any("agentrl_jax.agent.workers" in v for v in
               _violations("agentrl_jax.agent", ("environments",)))


MODULES = {_module_name(p) for p in ALL}


def _resolve(target: str) -> str | None:
    """The library module ``target`` names (``m.attr`` -> ``m``), None outside the library."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def import_graph(modules: dict[pathlib.Path, list[Import]]) -> dict[str, set[str]]:
    """Module -> the library modules it imports (lazy imports included). ``from p import m``
    counts ``p.m`` (a module) and not the package ``p`` as well."""
    graph: dict[str, set[str]] = {}
    for imports in modules.values():
        for imp in imports:
            graph.setdefault(imp.module, set())
            same_line = {i.target for i in imports if i.line == imp.line}
            if any(t.startswith(imp.target + ".") and t in MODULES for t in same_line):
                continue  # the package of ``from package import module``
            target = _resolve(imp.target)
            if target is not None and target != imp.module:
                graph[imp.module].add(target)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circles():
    """No two library modules import each other, directly or through others, lazy imports
    included (a lazy import only hides a circle)."""
    assert import_circles(import_graph(ALL)) == []


def test_the_circle_check_sees_a_lazy_circle(tmp_path):
    """The checker finds a circle closed by an import inside a function, and ignores the
    package of ``from package import module``."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from agentrl_jax.agent import chat\n")
    b.write_text("def f():\n    from agentrl_jax.agent import episode\n")
    fake = {a: _imports(a, "agentrl_jax.agent.episode"), b: _imports(b, "agentrl_jax.agent.chat")}
    assert import_circles(import_graph(fake)) == [["agentrl_jax.agent.chat",
                                                   "agentrl_jax.agent.episode"]]
    assert import_graph(fake)["agentrl_jax.agent.episode"] == {"agentrl_jax.agent.chat"}


def test_no_module_over_the_line_limit():
    long = {str(p.relative_to(REPO)): n for p in _files("agentrl_jax")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, f"modules over {MAX_LINES} lines (split them by job): {long}"
