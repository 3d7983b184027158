"""A pytest plugin: run SGLang's own unit tests on one side, SGLang's classes alone or with
policykit's SGLang plugin loaded.

The plugin changes four methods of SGLang's scheduling classes; SGLang's own tests of those
classes are the closest thing to SGLang's definition of them, so they should pass with the
plugin loaded as they pass without it. ``.ci/sglang-own-tests`` runs a folder of them once per
side and compares the outcomes (:mod:`tests.upstream.sglang_own.compare`)::

    python -m pytest -p tests.upstream.sglang_own.sides --sglang-side=policykit FOLDER

Both sides import SGLang as ``policykit conformance sglang`` does (its GPU-only packages
stubbed, so that a CPU machine runs them); ``policykit`` then loads the plugin through SGLang's
own ``load_plugins()`` with ``SGLANG_PLUGINS=policykit``, as an engine does, before any test
module imports SGLang's scheduler. Without a scheduler to read server args from, the combo is
``POLICYKIT_COMBO``, by default the one SGLang's default server args amount to.
"""

from __future__ import annotations

import os

import pytest

#: the combo SGLang 0.5.23's default server args amount to (defaults.from_server_args)
SERVER_ARG_DEFAULT = "admission=sglang,chunking=sglang,alignment=none,queue=fcfs"
SIDES = ("sglang", "policykit")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--sglang-side",
        choices=SIDES,
        default="sglang",
        help="sglang: SGLang's classes alone; policykit: with policykit's SGLang plugin loaded.",
    )


def pytest_configure(config: pytest.Config) -> None:
    from policykit.conformance.sglang.driver import UpstreamUnavailable, load

    try:
        load()
    except UpstreamUnavailable as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
    if config.getoption("--sglang-side") == "policykit":
        _load_plugin()


def _load_plugin() -> None:
    """SGLang's ``load_plugins()`` with the plugin allowed; stops the run if no hook landed."""
    os.environ["SGLANG_PLUGINS"] = "policykit"
    os.environ.setdefault("POLICYKIT_COMBO", SERVER_ARG_DEFAULT)
    from sglang.srt import plugins

    from policykit.integrations.sglang import hooks, plugin

    before = plugin.decision_methods()
    plugins.load_plugins()
    after = plugin.decision_methods()
    unhooked = [name for key, name in before if after[key, name] is before[key, name]]
    if unhooked or hooks.active() is None:
        pytest.exit(
            f"policykit's SGLang plugin did not hook {', '.join(unhooked) or 'its combo'}",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def pytest_report_header(config: pytest.Config) -> str:
    side = config.getoption("--sglang-side")
    if side == "sglang":
        return "SGLang side: SGLang's own classes"
    return f"SGLang side: policykit's plugin loaded, combo {os.environ['POLICYKIT_COMBO']}"
