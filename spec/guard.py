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
* **what the code writes** — attribute, global, subscript and closure-cell stores refuse it
  (a pure function has nothing to store outside its own locals);
* **which C functions it calls** — only a short list of pure built-ins (``min``, ``max``,
  ``abs`` ...) and methods of immutable values; the clock, randomness and container mutation
  are all C calls, so they refuse it;
* **exceptions it catches** — any exception caught inside policy code refuses it (the
  checker's signals derive from ``BaseException``, but ``except BaseException`` exists);
* **time** — a call that runs longer than the limit is stopped.

The first breach is recorded with ``file:line`` and wins, whatever the policy does next: a
breach noticed in the trace function cannot be swallowed by the policy.
"""

from __future__ import annotations

import builtins
import dis
import gc
import sys
import time
import types
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
_PURE_BUILTINS = {id(f) for f in (min, max, abs, divmod, len, sum, all, any, sorted, round, pow)}
#: C methods of these types cannot change anything (the values are immutable)
_IMMUTABLE = (int, bool, str, bytes, tuple, frozenset, type(None))

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


def _is_state(value: Any) -> bool:
    """A module-level value whose contents can change between calls."""
    if isinstance(value, types.ModuleType | types.FunctionType | type | types.BuiltinFunctionType):
        return False
    if isinstance(value, (*_IMMUTABLE, float, complex)):
        return isinstance(value, tuple | frozenset) and any(_is_state(x) for x in value)
    return not isinstance(value, types.MethodType | property | staticmethod | classmethod)


def _scan(code: types.CodeType, f_globals: dict[str, Any]) -> str | None:
    """Why ``code`` cannot run under the checker, or ``None``."""
    for name in code.co_names:
        if name in _DENIED_NAMES:
            return f"uses {name!r}, which observes a value's identity or reaches outside it"
    for ins in dis.get_instructions(code):
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
    return None


class Guard:
    """Watches policy code for one evaluation; ``violation`` is the first breach, if any."""

    def __init__(self, limit_s: float = CALL_LIMIT_S) -> None:
        self.limit_s = limit_s
        self.violation: Violation | None = None
        self._scanned: dict[types.CodeType, str | None] = {}
        self._deadline = 0.0
        self._caught: set[int] = set()
        self._saved: tuple[Any, Any, bool] = (None, None, True)

    # -- breaches ------------------------------------------------------------------------
    def note(self, what: str, frame: types.FrameType | None) -> None:
        """Record a breach the evaluator itself signalled (an unsupported operation)."""
        if self.violation is None:
            self.violation = Violation(what, "?" if frame is None else _where(frame))

    def breach(self, what: str, frame: types.FrameType) -> None:
        """Record the first breach and stop the policy there."""
        if self.violation is None:
            self.violation = Violation(what, _where(frame))
        raise Breach(what)

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
        reason = self._scanned[code]
        if reason is not None:
            self.breach(reason, frame)
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
        if id(arg) in _PURE_BUILTINS:
            return
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
                _where(frame),
            )
        # an exception cannot be raised from a profile function; the trace function stops
        # the policy at its next line instead
        self._deadline = 0.0

    def start(self) -> None:
        """Watch policy code run in this thread until :meth:`stop` (no context manager: its
        ``__exit__`` would run, watched, in library code)."""
        self._saved = (sys.gettrace(), sys.getprofile(), gc.isenabled())
        gc.disable()  # collector callbacks would run library code inside the watched call
        self._deadline = time.perf_counter() + self.limit_s
        self._caught.clear()
        sys.settrace(self._global_trace)
        sys.setprofile(self._profile)

    def stop(self) -> None:
        sys.settrace(self._saved[0])
        try:
            sys.setprofile(self._saved[1])
        except TypeError:  # a C-level profiler (cProfile) cannot be put back from Python
            sys.setprofile(None)
        if self._saved[2]:
            gc.enable()
