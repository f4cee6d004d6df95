"""Lab-test hygiene: every module must leave no run behind (its fabrics stopped, its killed runs
cleaned). A module that does is reported here, by name, and its leftovers are cleaned so that the
next module starts from nothing (a leftover run once made another module's test misread its state)."""

import os

import pytest


@pytest.fixture(scope="module", autouse=True)
def leaves_no_run_behind(request):
    # Autouse fixtures are set up first, so this one is torn down after the module's own fixtures.
    yield
    if os.geteuid() != 0:
        return
    from fabriclab.lab.clean import clean
    from fabriclab.lab.runstate import RunState

    left = [(run.id, "live" if run.live else "dead") for run in RunState.all()]
    if left:
        clean(all_runs=True)
        pytest.fail(f"{request.module.__name__} left runs behind: {left}", pytrace=False)
