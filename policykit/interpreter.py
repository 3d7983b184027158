"""Starting Python processes of policykit's own, and telling a shadowed install from a real one.

Python puts a directory first on the import path of every process: the working directory for
``python -c`` and ``python -m``, the script's folder for ``python script.py``. A folder named
``policykit`` there is imported instead of the installed package: with ``__init__.py`` it is
another package (a vendored copy, or the checkout's ``policykit/``, which lacks ``spec``,
``plugins`` and ``harness``: the install maps them from folders beside it); without one it is a
namespace package, which wins over an editable install (setuptools' finder comes after the
path). So the processes policykit starts never take that directory (:func:`python_argv`), and
the entry points a user's process imports say what happened instead of failing somewhere
later with an ``ImportError`` (:func:`shadowed_by`).
"""

from __future__ import annotations

import importlib.util
import sys

#: subpackages every install has; a ``policykit`` without them is not the installed one
_SUBPACKAGES = ("policykit.spec", "policykit.plugins", "policykit.harness")


def python_argv(*args: str) -> list[str]:
    """This interpreter with ``args``, under ``-P``: the child's import path does not start
    with the working directory, so a ``policykit/`` folder there cannot shadow the install."""
    return [sys.executable, "-P", *args]


def shadowed_by() -> str | None:
    """Why the imported ``policykit`` is not the installed package (one paragraph), or None.

    Asked where plugins are loaded, which every entry point reaches first (the CLI, the checker's
    processes, the vLLM scheduler class, the SGLang plugin)."""
    package = sys.modules.get("policykit")
    if package is None:  # pragma: no cover - this module is policykit's
        return None
    origin = getattr(package, "__file__", None)
    missing = [name for name in _SUBPACKAGES if not _findable(name)]
    if origin is not None and not missing:
        return None
    where = ", ".join(getattr(package, "__path__", []) or [str(origin)])
    what = (
        "a folder without __init__.py (a namespace package)"
        if origin is None
        else f"a package without {', '.join(missing)}"
    )
    return (
        f"Python imported 'policykit' from {where}, {what}, instead of the installed policykit: "
        "a folder named policykit in the working directory (python -c, python -m) or in the "
        "folder of the script being run comes first on the import path. Run from another "
        "directory, rename that folder, or start Python with -P (or set PYTHONSAFEPATH=1), "
        "which keeps that directory off the import path."
    )


def _findable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
