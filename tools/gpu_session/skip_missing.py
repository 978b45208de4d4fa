"""A pytest plugin for machines that lack some of the project's optional packages.

    python3 -m pytest -m gpu -q -p tools.gpu_session.skip_missing

The GPU machine's image has no fastapi, uvicorn, xgrammar, gguf, tensorizer,
openai or jsonschema. A test module that imports one of them would stop the
whole run at collection; with this plugin it is skipped instead, and so is a
test that fails because such an import fails inside it. The skip reason names
the missing package. A missing module of the project itself is never skipped:
that is a real error.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

PROJECT = ("minivllm", "tests", "tools", "benchmarks")
_NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


def missing_package(excinfo: Any) -> str | None:
    """The third-party package whose import failed, or None."""
    if excinfo is None or not excinfo.errisinstance(ModuleNotFoundError):
        return None
    name = (excinfo.value.name or "").split(".")[0]
    return name if name and name not in PROJECT else None


def _reason(package: str) -> str:
    return f"needs {package}, which is not installed on this machine"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: Any):
    outcome = yield
    report = outcome.get_result()
    if not report.failed or not isinstance(collector, pytest.Module):
        return
    # pytest words a failed module import as "... ModuleNotFoundError: No module named 'x'"
    match = _NO_MODULE.search(str(report.longrepr))
    name = match.group(1).split(".")[0] if match else None
    if name and name not in PROJECT:
        report.outcome = "skipped"
        report.longrepr = (str(collector.path), 0, f"Skipped: {_reason(name)}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any):
    outcome = yield
    report = outcome.get_result()
    package = missing_package(call.excinfo) if report.failed else None
    if package is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {_reason(package)}")
