"""The envelope every JSON document policykit writes carries: ``schema`` and ``created``.

A reader tells documents apart by ``schema`` (``policykit.<command>/<version>``) and dates them
by ``created`` (ISO 8601, UTC, to the second); one name each, whichever command wrote them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any


def now_iso() -> str:
    """The ``created`` stamp: the current UTC time, ISO 8601 to the second."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def stamped(data: Mapping[str, Any], schema: str) -> dict[str, Any]:
    """``data`` with ``schema`` and ``created`` first; values already in ``data`` win."""
    return {"schema": data.get("schema") or schema, "created": data.get("created") or now_iso()} | {
        k: v for k, v in data.items() if k not in ("schema", "created")
    }
