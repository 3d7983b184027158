"""The fence around policy code while the checker runs it.

The checker can only vouch for a policy whose answer is a function of its view, computed with
operations whose meaning it reproduces exactly. Python lets a policy step outside that in many
quiet ways: ask a value its type, catch the checker's own signals, count its calls on ``self``,
read the clock. Each of those makes the symbolic run verify a different program from the one
the scheduler runs. So while a policy method runs under the checker — symbolically, and on the
concrete samples of :mod:`policykit.spec.crossval` — a :class:`Guard` watches every frame of
code that is not the checker's own (the policy, its helpers, any library it calls):

* **what the code can name** — before a code object first runs, its names are looked up: the
  reflective built-ins (``type``, ``isinstance``, ``id``, ``getattr`` ...), frame and class
  internals (``__class__``, ``__dict__`` ...) and module-level containers (state) refuse it;
  module-level constants (ints, tuples of them, frozen dataclasses of them), functions and
  ``functools`` caches of functions are read, and each one read is remembered
  (:attr:`Guard.reads`) so that a later rebinding or mutation is noticed
  (:func:`changed`); a module that rebinds one with ``global`` refuses it outright; so does
  text of a value (``str``, ``repr``, ``format``, an f-string), which shows what a value *is*;
* **what the code writes** — attribute, global, subscript and closure-cell stores refuse it
  (a pure function has nothing to store outside its own locals);
* **which C functions it calls** — only a short list of pure built-ins (``min``, ``max``,
  ``abs`` ...) and methods of immutable values; the clock, randomness and container mutation
  are all C calls, so they refuse it;
* **exceptions it catches** — any exception caught inside policy code refuses it (the
  checker's signals derive from ``BaseException``, but ``except BaseException`` exists);
* **time** — a call that runs longer than the limit is stopped.

The first breach is recorded with ``file:line`` and wins, whatever the policy does next: a
breach noticed in the trace function cannot be swallowed by the policy. The line is the
policy's own: a breach inside a helper or library it called is reported at the policy's call,
with the helper's line beside it.

A symbolic run (``Guard(symbolic=True)``) also runs a module-level ``functools.cache`` /
``lru_cache`` helper as the plain function behind it (``__wrapped__``): a cache cannot hold
symbolic values, and for a pure function it changes nothing but the time. The module's name is
pointed at the plain function only while the guard runs (:meth:`Guard.start` ... :meth:`stop`,
and :func:`apply_swaps` for the model's unwatched re-runs).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import dis
import functools
import gc
import math
import operator
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import z3

#: seconds one policy call may run under the checker before it is refused
CALL_LIMIT_S = 2.0

_SPEC_DIR = str(Path(__file__).resolve().parent)
_Z3_DIR = str(Path(z3.__file__).resolve().parent)
_TRUSTED_DIRS = (_SPEC_DIR, _Z3_DIR)

#: names a policy's code may not mention: they observe what a value *is* rather than what it
#: *equals*, reach into frames and classes, or run code the checker never sees
_DENIED_NAMES = frozenset(
    {
        "type", "isinstance", "issubclass", "id", "hash", "vars", "globals", "locals", "dir",
        "getattr", "setattr", "delattr", "hasattr", "eval", "exec", "compile", "__import__",
        "open", "breakpoint", "object", "memoryview", "__class__", "__dict__", "__globals__",
        "__code__", "__closure__", "__builtins__", "__self__", "__func__", "__defaults__",
        "__kwdefaults__", "__subclasses__", "__mro__", "__bases__", "__getattribute__",
        "__setattr__", "f_back", "f_locals", "f_globals", "f_code", "tb_frame", "gi_frame",
        "cr_frame", "sys", "inspect", "gc", "ctypes", "environ", "getenv", "modules", "argv",
    }
)  # fmt: skip
#: modules a policy's code may use: the core's helpers and pure arithmetic (the clock, the
#: environment and randomness live in the others)
_PURE_MODULES = ("policykit", "math", "operator", "functools", "itertools", "enum", "typing")
_DENIED_OBJECTS = {id(getattr(builtins, n)): n for n in _DENIED_NAMES if hasattr(builtins, n)}

#: C functions a policy may call: pure functions of their arguments
_PURE_BUILTINS = {
    id(f)
    for f in (
        *(min, max, abs, divmod, len, sum, all, any, sorted, round, pow, math.ceil, math.floor),
        # the operators as functions: each runs the same special method the operator does
        *(operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod),
        *(operator.truediv, operator.neg, operator.pos, operator.abs, operator.not_),
        *(operator.lt, operator.le, operator.eq, operator.ne, operator.ge, operator.gt),
        *(operator.lshift, operator.rshift, operator.and_, operator.or_, operator.xor),
        *(operator.invert, operator.index),
        # folds with one of the above or a Python function (a lambda, a helper), which is
        # watched like any other; as with min/max/sorted's key, a C function it is handed
        # is not seen
        functools.reduce,
    )
}
#: C methods of these types cannot change anything (the values are immutable)
_IMMUTABLE = (int, bool, str, bytes, tuple, frozenset, type(None))

#: text of a value shows what it *is* (a function's address, a cache wrapper rather than the
#: function a symbolic run calls in its place), not what it equals
_TEXT_NAMES = frozenset({"str", "repr", "ascii", "format", "format_map", "__str__", "__repr__"})
_TEXT_OPS = frozenset({"FORMAT_VALUE", "FORMAT_SIMPLE", "FORMAT_WITH_SPEC", "CONVERT_VALUE"})

_STORES = frozenset(
    {"STORE_ATTR", "DELETE_ATTR", "STORE_GLOBAL", "DELETE_GLOBAL", "STORE_SUBSCR", "DELETE_SUBSCR"}
)


class Breach(BaseException):
    """Raised into policy code at a breach; a ``BaseException`` so that ``except Exception``
    does not catch it (and catching it anyway is itself a breach)."""


class Violation:
    """The first thing a policy did that the checker cannot follow (a plain class: a
    dataclass's generated ``__init__`` would itself run as watched code)."""

    def __init__(self, what: str, where: str) -> None:
        self.what, self.where = what, where

    def __str__(self) -> str:
        return f"{self.what} at {self.where}"


_TRUSTED: dict[types.CodeType, bool] = {}


def trusted(code: types.CodeType) -> bool:
    """The checker's own code and z3's: the only frames not watched."""
    known = _TRUSTED.get(code)
    if known is None:
        known = _TRUSTED[code] = code.co_filename.startswith(_TRUSTED_DIRS)
    return known


def _where(frame: types.FrameType) -> str:
    return f"{frame.f_code.co_filename}:{frame.f_lineno} (in {frame.f_code.co_name})"


#: the type ``functools.cache`` and ``functools.lru_cache`` wrap a function in
_CACHE_WRAPPER = type(functools.cache(lambda: None))

Swap = tuple[dict[str, Any], str, Any]  #: (module globals, name, the cache wrapper)


def cached_function(value: Any) -> types.FunctionType | None:
    """The plain function behind a ``functools`` cache, or ``None`` for anything else."""
    if isinstance(value, _CACHE_WRAPPER):
        wrapped = getattr(value, "__wrapped__", None)
        if isinstance(wrapped, types.FunctionType):
            return wrapped
    return None


def _frozen_record(value: Any) -> bool:
    return (
        dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and type(value).__dataclass_params__.frozen  # type: ignore[attr-defined]  # set by @dataclass, not declared
    )


def _record_items(value: Any) -> list[tuple[str, Any]]:
    """A frozen record's fields and anything else set on the instance (``object.__setattr__``
    reaches past ``frozen``)."""
    items = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    items.update(getattr(value, "__dict__", {}))
    return sorted(items.items())


def _is_state(value: Any) -> bool:
    """A module-level value whose contents can change between calls."""
    if isinstance(value, types.ModuleType | types.FunctionType | type | types.BuiltinFunctionType):
        return False
    if cached_function(value) is not None:
        return False  # a memo of a function the guard watches (a cache hit changes nothing)
    if _frozen_record(value):
        return any(_is_state(item) for _, item in _record_items(value))
    if isinstance(value, (*_IMMUTABLE, float, complex)):
        return isinstance(value, tuple | frozenset) and any(_is_state(x) for x in value)
    return not isinstance(value, types.MethodType | property | staticmethod | classmethod)


def fingerprint(value: Any) -> Any:
    """What must stay the same for a module-level value to mean what it meant: the values of a
    constant (so ``object.__setattr__`` on a frozen record shows), the identity of anything
    else (and a function's code and defaults, which can be reassigned)."""
    if _frozen_record(value):
        return (type(value), tuple((k, fingerprint(item)) for k, item in _record_items(value)))
    if isinstance(value, tuple):
        return (type(value), tuple(fingerprint(x) for x in value))
    if isinstance(value, frozenset):
        return (type(value), frozenset(fingerprint(x) for x in value))
    if isinstance(value, (*_IMMUTABLE, float, complex)):
        return (type(value), value)
    function = cached_function(value) or value
    if isinstance(function, types.FunctionType):
        defaults = (function.__defaults__, function.__kwdefaults__)
        return (id(value), id(function.__code__), fingerprint(repr(defaults)))
    return (type(value), id(value))


#: a global read by watched code: (module globals, name, fingerprint when read)
Read = tuple[dict[str, Any], str, Any]
_MISSING = object()


def changed(reads: dict[tuple[int, str], Read]) -> str | None:
    """The first module-level value in ``reads`` that no longer is what was read, or None."""
    for namespace, name, was in reads.values():
        if fingerprint(namespace.get(name, _MISSING)) != was:
            module = namespace.get("__name__", "?")
            return f"the module-level {name!r} of {module} changed after the checker read it"
    return None


_REBOUND: dict[str, dict[str, int]] = {}


def _rebound(filename: str | None) -> dict[str, int]:
    """Names a module's source declares ``global`` in some function: name -> line."""
    if not filename:
        return {}
    known = _REBOUND.get(filename)
    if known is None:
        known = _REBOUND[filename] = {}
        try:
            tree = ast.parse(Path(filename).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            return known
        for node in ast.walk(tree):
            if isinstance(node, ast.Global):
                for name in node.names:
                    known.setdefault(name, node.lineno)
    return known


_GLOBAL_LOADS: dict[types.CodeType, tuple[str, ...]] = {}


def _global_loads(code: types.CodeType) -> tuple[str, ...]:
    """The names ``code`` reads as globals."""
    names = _GLOBAL_LOADS.get(code)
    if names is None:
        names = _GLOBAL_LOADS[code] = tuple(
            dict.fromkeys(
                ins.argval
                for ins in dis.get_instructions(code)
                if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")
            )
        )
    return names


def _holds_bool(value: Any) -> bool:
    """A bool, or a tuple or frozenset with one inside (a cache key equal to one of ints)."""
    if isinstance(value, bool):
        return True
    return isinstance(value, tuple | frozenset) and any(_holds_bool(x) for x in value)


def apply_swaps(swaps: list[Swap]) -> None:
    """Point each cached helper's module name at the plain function behind the cache."""
    for namespace, name, wrapper in swaps:
        namespace[name] = wrapper.__wrapped__


def restore_swaps(swaps: list[Swap]) -> None:
    for namespace, name, wrapper in reversed(swaps):
        namespace[name] = wrapper


def _scan(code: types.CodeType, f_globals: dict[str, Any]) -> str | None:
    """Why ``code`` cannot run under the checker, or ``None``."""
    for name in code.co_names:
        if name in _DENIED_NAMES:
            return f"uses {name!r}, which observes a value's identity or reaches outside it"
        if name in _TEXT_NAMES:
            return f"turns a value into text ({name}), which shows what it is, not its value"
    for ins in dis.get_instructions(code):
        if ins.opname in _TEXT_OPS:
            return "turns a value into text (an f-string), which shows what it is, not its value"
        if ins.opname in _STORES:
            return f"writes state outside its locals ({ins.opname} {ins.argrepr})".replace(
                " )", ")"
            )
        if ins.opname == "IMPORT_NAME":
            return f"imports {ins.argval!r} while deciding"
        if ins.opname in ("STORE_DEREF", "DELETE_DEREF") and ins.argval in code.co_freevars:
            return f"writes the enclosing function's variable {ins.argval!r} (a closure counter)"
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            name = ins.argval
            if name in f_globals:
                value = f_globals[name]
            elif hasattr(builtins, name):
                value = getattr(builtins, name)
            else:
                continue
            if id(value) in _DENIED_OBJECTS:
                return f"uses {_DENIED_OBJECTS[id(value)]!r} under the name {name!r}"
            if isinstance(value, types.ModuleType) and (
                value.__name__.split(".")[0] not in _PURE_MODULES
                or value.__name__.startswith("policykit.spec")
            ):
                return f"uses the module {value.__name__!r} (the environment, clock or checker)"
            if name in f_globals and _is_state(value):
                return (
                    f"reads the module-level {type(value).__name__} {name!r}, which can change "
                    "between calls"
                )
            line = _rebound(f_globals.get("__file__")).get(name) if name in f_globals else None
            if line is not None:
                return (
                    f"reads the module-level {name!r}, which its module rebinds (global {name} "
                    f"at {f_globals['__file__']}:{line}): the scheduler may read another value "
                    "than the checker did"
                )
    return None


def own_files(policy: Any) -> frozenset[str]:
    """The source files of a policy's classes (not policykit's bases): where its author's
    lines are."""
    bases = sys.modules["policykit.policy"].__file__ or ""
    files = set()
    for cls in type(policy).__mro__:
        module = sys.modules.get(cls.__module__)
        path = getattr(module, "__file__", None)
        if path and cls is not object:
            files |= {path, str(Path(path).resolve())}
    return frozenset(files - {bases, str(Path(bases).resolve())})


class Guard:
    """Watches policy code for one evaluation; ``violation`` is the first breach, if any.

    ``owner`` (the policy) says whose lines a breach is reported at; ``symbolic`` runs cached
    helpers uncached (see the module's docstring)."""

    def __init__(
        self, limit_s: float = CALL_LIMIT_S, *, owner: Any = None, symbolic: bool = False
    ) -> None:
        self.limit_s = limit_s
        self.violation: Violation | None = None
        #: every module-level value watched code read: (id(globals), name) -> Read
        self.reads: dict[tuple[int, str], Read] = {}
        #: the cached helpers a symbolic run points at their plain functions
        self.swaps: list[Swap] = []
        self._symbolic = symbolic
        self._untyped: set[types.CodeType] = set()  # functions behind caches with typed=False
        # file names only: resolving paths here would run library code inside the watch
        self._own = own_files(owner) if owner is not None else frozenset()
        self._scanned: dict[types.CodeType, str | None] = {}
        self._deadline = 0.0
        self._caught: set[int] = set()
        self._saved: tuple[Any, Any, bool] = (None, None, True)

    # -- breaches ------------------------------------------------------------------------
    def note(self, what: str, frame: types.FrameType | None) -> None:
        """Record a breach the evaluator itself signalled (an unsupported operation)."""
        if self.violation is None:
            self.violation = Violation(what, "?" if frame is None else self.where(frame))

    def breach(self, what: str, frame: types.FrameType) -> None:
        """Record the first breach and stop the policy there."""
        if self.violation is None:
            self.violation = Violation(what, self.where(frame))
        raise Breach(what)

    def where(self, frame: types.FrameType) -> str:
        """``file:line`` of the policy's own frame nearest the breach, with the breach's own
        place beside it when that is in a helper or library the policy called."""
        own: types.FrameType | None = frame
        while own is not None and self._own and own.f_code.co_filename not in self._own:
            own = own.f_back
        if own is None or own is frame or not self._own:
            return _where(frame)
        return f"{_where(own)}, inside {frame.f_code.co_name}() at {_where(frame)}"

    # -- module-level values ---------------------------------------------------------------
    def _remember(self, code: types.CodeType, frame: types.FrameType) -> None:
        """Note the globals ``code`` reads; in a symbolic run, uncache cached helpers."""
        namespace = frame.f_globals
        for name in _global_loads(code):
            if name not in namespace:
                continue
            value = namespace[name]
            self.reads.setdefault((id(namespace), name), (namespace, name, fingerprint(value)))
            function = cached_function(value)
            if self._symbolic and function is not None:
                if not value.cache_parameters().get("typed"):
                    self._untyped.add(function.__code__)
                swap = (namespace, name, value)
                self.swaps.append(swap)
                apply_swaps([swap])

    def _check_cached_call(self, code: types.CodeType, frame: types.FrameType) -> None:
        """A ``typed=False`` cache answers ``f(1)`` with what it computed for ``f(True)``:
        the checker runs it uncached, so a bool argument would make the two differ."""
        count = code.co_argcount + code.co_kwonlyargcount
        for arg in code.co_varnames[:count]:
            if _holds_bool(frame.f_locals.get(arg)):
                self.breach(
                    f"passes a bool ({arg}) to {code.co_name}, a functools cache that does not "
                    "tell True from 1 (typed=False); pass int(...) or use lru_cache(typed=True)",
                    frame,
                )

    # -- sys.settrace: calls, stores, caught exceptions, time ------------------------------
    def _global_trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if trusted(code):
            caller = frame.f_back
            if (
                code.co_name != "__del__"  # the garbage collector runs where it likes
                and caller is not None
                and not trusted(caller.f_code)
                and (code.co_filename.startswith(_Z3_DIR) or not code.co_name.startswith("__"))
            ):
                self.breach(f"calls the checker's internals ({code.co_name})", caller)
            return None
        if code not in self._scanned:
            self._scanned[code] = _scan(code, frame.f_globals)
            if self._scanned[code] is None:
                self._remember(code, frame)
        reason = self._scanned[code]
        if reason is not None:
            self.breach(reason, frame)
        if code in self._untyped:
            self._check_cached_call(code, frame)
        return self._local_trace

    def _local_trace(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "exception":
            self._caught.add(id(frame))
        elif event == "line":
            if id(frame) in self._caught:
                self.breach("catches an exception", frame)
            if time.perf_counter() > self._deadline:
                self.breach(f"did not return within {self.limit_s:g} s", frame)
        elif event == "return":
            self._caught.discard(id(frame))
        return self._local_trace

    # -- sys.setprofile: C calls -----------------------------------------------------------
    def _profile(self, frame: types.FrameType, event: str, arg: Any) -> None:
        if event != "c_call" or trusted(frame.f_code):
            return
        if id(arg) in _PURE_BUILTINS or cached_function(arg) is not None:
            return  # a cache's miss runs its function, which is watched like any other
        owner = getattr(arg, "__self__", None)
        if (
            owner is not None
            and isinstance(owner, _IMMUTABLE)
            and not isinstance(owner, types.ModuleType)
        ):
            return
        name = getattr(arg, "__qualname__", None) or getattr(arg, "__name__", repr(arg))
        if self.violation is None:
            self.violation = Violation(
                f"calls {name}(), which the checker cannot follow (only pure built-ins such as "
                "min, max and abs)",
                self.where(frame),
            )
        # an exception cannot be raised from a profile function; the trace function stops
        # the policy at its next line instead
        self._deadline = 0.0

    @staticmethod
    def suspended(work: Callable[[], Any]) -> Any:
        """Run the checker's own ``work`` (a solver query) in the middle of a watched call,
        unwatched: z3's Python API calls library code the guard would otherwise refuse."""
        tracer, profiler = sys.gettrace(), sys.getprofile()
        sys.settrace(None)
        sys.setprofile(None)
        try:
            return work()
        finally:
            sys.settrace(tracer)
            sys.setprofile(profiler)

    def start(self) -> None:
        """Watch policy code run in this thread until :meth:`stop` (no context manager: its
        ``__exit__`` would run, watched, in library code)."""
        self._saved = (sys.gettrace(), sys.getprofile(), gc.isenabled())
        gc.disable()  # collector callbacks would run library code inside the watched call
        self._deadline = time.perf_counter() + self.limit_s
        self._caught.clear()
        apply_swaps(self.swaps)
        sys.settrace(self._global_trace)
        sys.setprofile(self._profile)

    def stop(self) -> None:
        sys.settrace(self._saved[0])
        restore_swaps(self.swaps)
        try:
            sys.setprofile(self._saved[1])
        except TypeError:  # a C-level profiler (cProfile) cannot be put back from Python
            sys.setprofile(None)
        if self._saved[2]:
            gc.enable()
