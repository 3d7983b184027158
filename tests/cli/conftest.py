"""Invoking the command line in process, the way a user's shell would."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from policykit.cli import main


@pytest.fixture
def cli():
    """``cli(*args, pm=None, columns=200)``: run ``policykit ARGS`` and return the result."""

    def run(*args: str, pm=None, columns: int = 200) -> Result:
        runner = CliRunner(env={"COLUMNS": str(columns)})
        return runner.invoke(main, list(args), obj={"pm": pm} if pm else None)

    return run
