"""The ``--config`` command line of the launch scripts, checked before absl parses it.

``ml_collections.config_flags`` loads the experiment file and applies ``--config.a.b=v``
overrides one at a time, raising a traceback at the first mistake (an unknown key, a value
that does not parse as the key's type, a missing or broken file). ``cli_problems(argv)`` looks
at the same command line first and returns one line per mistake, all of them at once:

- ``--config``: the file is missing, does not import (the exception and its line), has no
  ``get_config()``, has no variant of the name after ``:`` (its variants listed) or takes no
  variant, or its ``get_config()`` fails or returns no ``ConfigDict``;
- ``--config.<key>``: no such key (with a "did you mean" from ``difflib`` over the real keys,
  or the same key name in another section), a key under a value that is not a section, a value
  that does not parse as the key's type (``int``, ``float``, ``bool``, ``tuple``, ``str``,
  a dict for a section), or a missing value.

``run_main(main)`` is what each launch script's ``__main__`` calls instead of
``absl.app.run(main)``: mistakes are printed (``invalid config (N problems):`` then one
indented line each) and the process exits with ``EXIT_BAD_CONFIG`` (2) before anything starts;
otherwise ``main(argv, config)`` gets the typed ``RunConfig``, built once.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
import sys
import traceback
from typing import Any, Callable

from absl import app, flags
from ml_collections import ConfigDict, config_flags
from ml_collections.config_flags import tuple_parser

from agentrl_common.typed_sections import close_names

_PARSERS: dict[type, flags.ArgumentParser] = {
    int: flags.IntegerParser(), float: flags.FloatParser(), bool: flags.BooleanParser(),
    str: flags.ArgumentParser(), tuple: tuple_parser.TupleParser()}


def load_config_file(spec: str, **kwargs: Any) -> tuple[Any, str | None]:
    """(the config of ``spec``, None) or (None, one-line problem). ``spec`` is ``path`` or
    ``path:variant`` (``variant`` is passed to ``get_config``, as ``ml_collections`` does; a
    file with named variants lists them in ``VARIANTS``, experiments/common.py).
    ``kwargs`` go to ``get_config`` where it takes them (``num_gpus`` for a config sized by
    GPU count) and are dropped where it does not."""
    path, *arg = spec.split(":", 1)
    if not path:
        return None, "--config: no file given"
    if not os.path.isfile(path):
        return None, f"--config: no such file: {path}"
    try:
        module_spec = importlib.util.spec_from_file_location("_config_cli_check", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    except Exception as e:  # a syntax error, a failed import, anything the file raises
        return None, f"--config: {path} does not load: {_describe(e, path)}"
    get_config = getattr(module, "get_config", None)
    if not callable(get_config):
        return None, (f"--config: {path} has no get_config() (an experiment file defines "
                      "get_config() returning its ConfigDict)")
    problem = _variant_problem(module, get_config, path, arg)
    if problem:
        return None, problem
    parameters = inspect.signature(get_config).parameters
    given = {k: v for k, v in kwargs.items() if k in parameters}
    try:
        config = get_config(*arg, **given)
    except Exception as e:
        return None, f"--config: {path}: get_config() failed: {_describe(e, path)}"
    if not isinstance(config, ConfigDict):
        return None, (f"--config: {path}: get_config() returned {type(config).__name__}, "
                      "not a ConfigDict")
    return config, None


def load_experiment(spec: str, **kwargs: Any) -> ConfigDict:
    """The config of ``spec`` (``path`` or ``path:variant``; ``kwargs`` as for
    :func:`load_config_file`) for a tool's command line: ``SystemExit`` with the one-line
    problem when it does not load."""
    config, problem = load_config_file(spec, **kwargs)
    if problem:
        raise SystemExit(problem)
    return config


def _variant_problem(module: Any, get_config: Callable[..., Any], path: str,
                     arg: list[str]) -> str | None:
    """The problem of ``path:<arg>``: a variant the file does not have (its ``VARIANTS`` named),
    or a variant given to a ``get_config()`` that takes none; None when there is none."""
    if not arg:
        return None
    variants = getattr(module, "VARIANTS", None)
    if isinstance(variants, dict) and arg[0] not in variants:
        close = close_names(arg[0], list(variants))
        hint = f" (did you mean {close[0]}?)" if close else ""
        return (f"--config: {path} has no variant {arg[0]!r}{hint}; its variants: "
                f"{', '.join(variants)}")
    positional = [p for p in inspect.signature(get_config).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    if not positional:
        return f"--config: {path} takes no variant (got :{arg[0]}; give the file alone)"
    return None


def experiment_run_name(spec: str) -> str:
    """The run's name of ``--config`` ``spec``: the file's name without ``.py``, then
    ``_<variant>`` when one is given (``experiments/babyai.py:grpo_gpu`` -> ``babyai_grpo_gpu``).
    A run's default workdir is ``runs/<this>``."""
    path, _, variant = spec.partition(":")
    name = os.path.splitext(os.path.basename(path))[0]
    return f"{name}_{variant}" if variant else name


def _describe(error: BaseException, path: str) -> str:
    """``Type: message (line N)``, the line being the deepest one of ``path`` in the trace."""
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} (line {error.lineno})"
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__)
             if os.path.abspath(f.filename) == os.path.abspath(path)]
    where = f" (line {lines[-1]})" if lines else ""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}{where}" if text else f"{type(error).__name__}{where}"


def _keys(config: ConfigDict, prefix: str = "") -> list[str]:
    """Every dotted key of ``config`` (sections and leaves)."""
    out = []
    for key in config.keys():
        out.append(prefix + key)
        value = config[key]
        if isinstance(value, ConfigDict):
            out.extend(_keys(value, f"{prefix}{key}."))
    return out


def _suggest(config: ConfigDict, path: list[str], depth: int) -> str:
    """`` (did you mean --config.<key>?)`` for the unknown ``path[depth]``: each unknown part
    from there on replaced by the closest key of its section (``difflib``); else the same key
    name in another section; else the keys of the deepest section found."""
    holder = config
    for part in path[:depth]:
        holder = holder[part]
    fixed = list(path[:depth])
    for part in path[depth:]:
        if not isinstance(holder, ConfigDict):
            break
        close = [part] if part in holder else close_names(part, holder.keys())
        if not close:
            break
        fixed.append(close[0])
        holder = holder[close[0]]
    else:
        return f" (did you mean --config.{'.'.join(fixed)}?)"
    same_leaf = [k for k in _keys(config) if k.rsplit(".", 1)[-1] == path[-1]]
    if same_leaf:
        return f" (did you mean --config.{same_leaf[0]}?)"
    section = ".".join(fixed) or "the config"
    hint = f"did you mean --config.{section}? " if len(fixed) > depth else ""
    listed = f"{section} has: {', '.join(sorted(holder.keys()))}"
    return f" ({hint}{listed})" if isinstance(holder, ConfigDict) else f" ({hint.strip()})"


def override_problem(config: ConfigDict, key: str, value: str | None) -> str | None:
    """The problem of ``--config.<key>=<value>`` (``value`` None: given without a value), or
    None when ``ml_collections`` will apply it."""
    path = key.split(".")
    holder: Any = config
    for depth, part in enumerate(path):
        if not isinstance(holder, ConfigDict):
            return (f"--config.{key}: {'.'.join(path[:depth])} is a value, not a section "
                    f"(got {key})")
        if part not in holder:
            kind = "key" if depth == len(path) - 1 else "section"
            return f"--config.{key}: no such {kind}{_suggest(config, path, depth)}"
        if depth < len(path) - 1:
            holder = holder[part]
    field_type = holder.get_type(path[-1])
    if value is None:
        return None if field_type in (bool, object) else f"--config.{key}: needs a value"
    if field_type is object:  # ml_collections reads any literal
        return None
    if isinstance(field_type, type) and issubclass(field_type, ConfigDict):
        try:
            ok = isinstance(ast.literal_eval(value), dict)
        except (SyntaxError, ValueError):
            ok = False
        return None if ok else f"--config.{key}: must be a dict (a section; got {value!r})"
    parser = _PARSERS.get(field_type)
    if field_type is type(None):
        return (f"--config.{key}: is None in the experiment file, so its type is unknown and "
                "it cannot be set on the command line; set it in the file")
    if parser is None:
        return (f"--config.{key}: a {field_type.__name__} value cannot be set on the command "
                "line; set it in the experiment file")
    try:
        parser.parse(value)
    except (ValueError, TypeError, SyntaxError):
        return f"--config.{key}: must be {_what(field_type)} (got {value!r})"
    return None


def _what(field_type: type) -> str:
    return {int: "an integer", float: "a number", bool: "true or false",
            tuple: "a tuple, e.g. '(a, b)'"}.get(field_type, f"a {field_type.__name__}")


def _overrides(argv: list[str], name: str
               ) -> tuple[str | None, list[tuple[str, str | None]], list[str]]:
    """(the ``--<name>`` value or None, [(key, value or None)] of its ``--<name>.<key>``
    overrides, in order, [keys given before ``--<name>``]). A value given as the next argument
    (``--config.a.b 3``) is taken for every override whose next argument is not a flag, as absl
    takes it for a non-boolean."""
    spec, out, early = None, [], []
    flag = re.compile(rf"^--?(no)?{re.escape(name)}(\.[^=]+)?(=(.*))?$", re.S)
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            break
        m = flag.match(arg)
        i += 1
        if not m:
            continue
        negated, key, has_value, value = m.group(1), m.group(2), m.group(3), m.group(4)
        if key is None:  # --config path / --config=path
            if negated:
                continue
            if has_value is None and i < len(argv):
                value, i = argv[i], i + 1
            spec = value
            continue
        if spec is None:
            early.append(key[1:])
        if negated:  # --noconfig.a.b: a boolean set to False
            out.append((key[1:], "false"))
            continue
        if has_value is None and i < len(argv) and not re.match(r"--|-[A-Za-z_]", argv[i]):
            value, i = argv[i], i + 1
        out.append((key[1:], value))
    return spec, out, early


def cli_problems(argv: list[str], name: str = "config") -> list[str]:
    """One line per mistake in ``--<name>`` and its overrides in ``argv`` (without the
    program name); [] when there is none or ``--<name>`` is not given."""
    spec, overrides, early = _overrides(argv, name)
    if spec is None:
        return [f"--{name}.{key}: given without --{name} <experiment file>"
                for key, _ in overrides[:1]]
    config, problem = load_config_file(spec)
    if problem:
        return [problem.replace("--config", f"--{name}")]
    problems = [f"--config.{key}: must come after --{name} <experiment file>" for key in early]
    problems += [override_problem(config, key, value) for key, value in overrides]
    return [p.replace("--config", f"--{name}") for p in problems if p]


def load_with_overrides(argv: list[str], name: str = "config"
                        ) -> tuple[ConfigDict | None, list[str], list[str]]:
    """(the ConfigDict of ``--<name>`` with its ``--<name>.<key>`` overrides applied by
    ``ml_collections.config_flags`` itself, those overrides as ``--config.<key>[=<value>]``
    arguments for a launch script, problems): the config is None when there are problems
    (:func:`cli_problems`) or no ``--<name>``."""
    problems = cli_problems(argv, name)
    spec, overrides, _ = _overrides(argv, name)
    if problems or spec is None:
        return None, [], problems
    given = [f".{key}" if value is None else f".{key}={value}" for key, value in overrides]
    values = flags.FlagValues()
    args = ["load_with_overrides", f"--{name}={spec}", *(f"--{name}{g}" for g in given)]
    # sys_argv: ml_collections defines the override flags it finds there (else in sys.argv,
    # which lacks them when this is called from Python, and a key whose config-file default is
    # None would then be an unknown flag)
    config_flags.DEFINE_config_file(name, flag_values=values, sys_argv=args)
    values(args)
    return values[name].value, [f"--config{g}" for g in given], []


def run_main(main: Callable[[list[str], Any], Any], name: str = "config",
             check: Callable[[Any], Any] | None = None) -> None:
    """``absl.app.run`` of ``main(argv, config)`` where ``config`` is the typed ``RunConfig`` of
    ``--<name>`` (None when it is not given), built once before ``main`` starts anything.

    Mistakes in the command line (:func:`cli_problems`) and in the loaded config's values
    (``check``: ConfigDict -> RunConfig raising ``ConfigError``; default
    ``training/config/experiment.py::to_run_config``) are printed as ``invalid config (N problems):``
    then one indented line each, and the process exits with ``EXIT_BAD_CONFIG`` (2)."""
    from agentrl_jax.training.config.experiment import (EXIT_BAD_CONFIG, ConfigError, format_problems,
                                             to_run_config)

    argv = sys.argv[1:]
    try:  # --flagfile=... expanded as absl will
        argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
    except flags.Error:
        pass  # absl reports it itself
    problems = cli_problems(argv, name)
    if problems:
        print(format_problems(problems), file=sys.stderr, flush=True)
        sys.exit(EXIT_BAD_CONFIG)

    def typed_main(args: list[str]) -> Any:
        value = flags.FLAGS[name].value
        config = None
        if value is not None:
            try:
                config = (check or to_run_config)(value)
            except ConfigError as error:
                print(error, file=sys.stderr, flush=True)
                sys.exit(EXIT_BAD_CONFIG)
        return main(args, config)

    app.run(typed_main)
