"""What the SGLang plugin reads from the environment (the SGLang releases it supports are
:data:`policykit.engines.RELEASES`).

The plugin is opt-in twice over: SGLang runs *every* installed general plugin when
``SGLANG_PLUGINS`` is empty, so installing ``policykit[sglang]`` must not change an engine that
did not ask for it. It acts only when ``SGLANG_PLUGINS`` names ``policykit``; the combo comes
from ``POLICYKIT_COMBO`` or from the file named by ``POLICYKIT_CONFIG``, and without either from
SGLang's own server args (:mod:`policykit.integrations.sglang.defaults`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from policykit.errors import ComboError, quote

#: the entry-point name users list in ``SGLANG_PLUGINS``
PLUGIN_NAME = "policykit"
COMBO_ENV = "POLICYKIT_COMBO"
CONFIG_ENV = "POLICYKIT_CONFIG"
#: ``0`` skips the start-up ``policykit check`` (the z3 proof costs seconds per property)
CHECK_ENV = "POLICYKIT_STARTUP_CHECK"


def named_in_allow_list(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``SGLANG_PLUGINS`` lists this plugin explicitly (an empty list does not count)."""
    env = os.environ if environ is None else environ
    names = {n.strip() for n in env.get("SGLANG_PLUGINS", "").split(",")}
    return PLUGIN_NAME in names


def combo_text(environ: Mapping[str, str] | None = None) -> str:
    """The configured combo, ``KIND=POLICY,...``: from ``POLICYKIT_COMBO``, else the file in
    ``POLICYKIT_CONFIG`` (one ``KIND=POLICY`` per line or comma-separated, ``#`` comments).

    Unset, it is an error here (``policykit sglang-plugin --check`` checks a combo it is
    given); the plugin, which has a default of its own, asks :func:`configured_combo_text`.
    """
    env = os.environ if environ is None else environ
    text = env.get(COMBO_ENV, "").strip()
    if text:
        return text
    path = env.get(CONFIG_ENV, "").strip()
    if not path:
        raise ComboError(
            f"The policykit SGLang plugin is enabled but no combo is configured: set "
            f"{COMBO_ENV}=admission=reserve-tail,chunking=sglang,alignment=page (for example) or "
            f"{CONFIG_ENV} to a file holding such a combo."
        )
    try:
        raw = Path(path).read_text()
    except OSError as exc:
        raise ComboError(
            f"{CONFIG_ENV} names {quote(path)}, which cannot be read ({exc.strerror})."
        ) from None
    parts = [line.split("#", 1)[0].strip() for line in raw.splitlines()]
    text = ",".join(p for p in parts if p)
    if not text:
        raise ComboError(f"The combo file {quote(path)} ({CONFIG_ENV}) holds no KIND=POLICY line.")
    return text


def configured_combo_text(environ: Mapping[str, str] | None = None) -> str | None:
    """The combo of :func:`combo_text`, or None when neither variable is set: the SGLang plugin
    then runs the combo its server args amount to
    (:func:`policykit.integrations.sglang.defaults.from_server_args`)."""
    env = os.environ if environ is None else environ
    if not env.get(COMBO_ENV, "").strip() and not env.get(CONFIG_ENV, "").strip():
        return None
    return combo_text(env)


def startup_check_enabled(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(CHECK_ENV, "1").strip() != "0"
