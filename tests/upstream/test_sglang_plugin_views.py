"""The plugin's fast view builders make the very objects the public view constructors make.

Policies inside SGLang must receive what they receive in ``policykit simulate``; the builders
skip the frozen-dataclass ``__init__`` for speed, so each one is held here to its class's
fields (a field added to a view in ``policykit.policy`` fails this test, not an engine).
Needs no SGLang.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from policykit.integrations.sglang.views import BUILDERS


@pytest.mark.parametrize("build, cls", BUILDERS, ids=lambda x: getattr(x, "__name__", ""))
def test_builder_takes_exactly_the_view_fields_in_order(build, cls):
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(inspect.signature(build).parameters) == names


@pytest.mark.parametrize("build, cls", BUILDERS, ids=lambda x: getattr(x, "__name__", ""))
def test_built_view_is_the_constructed_view(build, cls):
    values = [7 + 3 * i for i, _ in enumerate(dataclasses.fields(cls))]
    built, made = build(*values), cls(*values)
    assert type(built) is cls
    assert built == made and hash(built) == hash(made)
    assert repr(built) == repr(made)
    assert dataclasses.asdict(built) == dataclasses.asdict(made)
    assert dataclasses.replace(built) == made
    first = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(built, first, 0)
