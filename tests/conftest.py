import faulthandler
import os

import pytest


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so fixtures can tell whether the test failed."""
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    """With GPUHUB_CRASH_LOG (tests/run.sh): a crash of the test process dumps every thread's
    stack into that file (after pytest's own faulthandler, which writes to standard error),
    for run.sh to show the crashed thread last."""
    path = os.environ.get("GPUHUB_CRASH_LOG")
    if path:
        config.stash[_crash_file] = open(path, "w")  # noqa: SIM115 (open until the process ends)
        faulthandler.enable(config.stash[_crash_file], all_threads=True)


_crash_file = pytest.StashKey()
