"""Pieces shared by the commands: plugin loading with clean errors, the combo options, JSON
output and the ``--out`` file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from policykit.config import EngineConfig
from policykit.documents import stamped
from policykit.errors import ComboError, PolicykitError
from policykit.plugin_manager import PolicykitPluginManager, make_plugin_manager
from policykit.registry import COMBO_FORM, Combo, PolicyRegistry

F = TypeVar("F", bound=Callable[..., Any])


def load_registry() -> tuple[PolicykitPluginManager, PolicyRegistry]:
    """The plugin manager and registry for this invocation.

    A caller embedding the CLI (a test, a notebook) may pass its own manager as
    ``main(obj={"pm": pm})``; otherwise a fresh one with every installed plugin is built.
    Plugin errors surface as :class:`~policykit.errors.PluginError`.
    """
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    pm = obj.get("pm") if isinstance(obj, dict) else None
    if pm is None:
        pm = make_plugin_manager()
    return pm, PolicyRegistry.from_plugins(pm)


def _command_name() -> str:
    ctx = click.get_current_context(silent=True)
    return (ctx.info_name if ctx is not None else None) or "policykit"


def document(data: dict[str, Any], schema: str | None = None) -> dict[str, Any]:
    """``data`` stamped with ``schema`` (default ``policykit.<command>/1``) and ``created``."""
    return stamped(data, schema or f"policykit.{_command_name()}/1")


def echo_json(data: dict[str, Any], schema: str | None = None) -> None:
    """Print one JSON document (stamped, see :func:`document`) on stdout."""
    click.echo(json.dumps(document(data, schema), indent=2, sort_keys=False, default=str))


def write_json(path: Path, data: dict[str, Any], schema: str | None = None) -> None:
    """Write one JSON document to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(document(data, schema), indent=2, default=str) + "\n", "utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise PolicykitError(
            f"Cannot write the results to {str(path)!r}: {exc.strerror}."
        ) from None


def check_out_path(out: Path | None) -> None:
    """Refuse an ``--out`` whose folder does not exist before any work is done."""
    if out is not None and not out.parent.is_dir():
        raise PolicykitError(f"--out {str(out)!r}: the folder {str(out.parent)!r} does not exist.")


json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document instead of the table."
)
out_option = click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the JSON document to this file.",
)

#: where ``--executor ray`` connects; shared by every command that hands out units
ray_address_option = click.option(
    "--ray-address", default=None, help="Join this Ray cluster (e.g. auto) with --executor ray."
)


def combo_options(func: F) -> F:
    """``--combo`` (repeatable), ``--combos`` (the same, ``;``-separated) and ``--all``.

    The command receives ``combos`` (every combo text given, in order) and ``check_all``;
    :func:`combo_texts` turns them into the list to run.
    """
    func = click.option(
        "--all",
        "check_all",
        is_flag=True,
        help="Every registered combination of the kinds that change a verdict (admission, "
        "chunking, alignment, queue) that runs on this engine configuration; the allocator "
        "phase stays at its default.",
    )(func)
    func = click.option(
        "--combos",
        "combo_list",
        multiple=True,
        metavar="COMBO;COMBO...",
        help="The same as --combo, several separated by ';' ('all' means --all).",
    )(func)
    return click.option(
        "--combo",
        "combos",
        multiple=True,
        metavar="COMBO",
        help=f"A combination, printed form {COMBO_FORM} (the queue defaults to fcfs, as in "
        "SGLang) or KIND=POLICY[,KIND=POLICY...]; repeatable.",
    )(func)


def combo_texts(
    combos: tuple[str, ...], combo_list: tuple[str, ...], check_all: bool
) -> list[str] | None:
    """The combos a command was given, or ``None`` for every registered combination."""
    texts = [named_combo(text) for text in combos]
    for item in combo_list:
        parts = [p.strip() for p in item.split(";") if p.strip()]
        if parts == ["all"]:
            check_all = True
            continue
        if not parts:
            raise ComboError(
                f"--combos {item!r} names no combination; write COMBO;COMBO, for example "
                "'sglang/sglang/checkpoint:256;reserve-tail/sglang/checkpoint:256', or 'all'."
            )
        texts += parts
    if check_all and texts:
        raise ComboError("Give either --all or --combo, not both.")
    return None if check_all else texts


def named_combo(text: str, option: str = "--combo") -> str:
    """``text`` when it names something; a blank one is bad input, not "the defaults" (a shell
    variable that expanded to nothing must not check a combo nobody asked for)."""
    if not text.strip():
        raise ComboError(
            f"{option} {text!r} names no combination; write one such as "
            "reserve-tail/sglang/checkpoint:256 or admission=reserve-tail, or leave the option "
            "out."
        )
    return text


def warn_if_uncheckable(
    combo: Combo, engine: EngineConfig, *, as_json: bool = False, seen: set[str] | None = None
) -> None:
    """Say on stderr (without failing) when ``policykit check`` would refuse ``combo``.

    Under ``--json`` the warning is a one-line JSON object, so that stderr stays machine-read.
    A reason already in ``seen`` is not repeated (one float-using policy in 12 combos of a
    bench is one warning).
    """
    from policykit.spec import checkable

    reason = checkable(combo, engine)
    if reason is None or (seen is not None and reason in seen):
        return
    if seen is not None:
        seen.add(reason)
    text = f"{combo} is not checkable, so `policykit check` will refuse it: {reason}"
    if as_json:
        click.echo(json.dumps({"warning": " ".join(text.split())}), err=True)
    else:
        click.echo(f"Warning: {' '.join(text.split())}", err=True)
