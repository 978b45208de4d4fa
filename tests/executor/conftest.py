"""Every executor test module checks that no worker process outlives it."""

import gc

import pytest

from tests.executor import tp_helpers as h


@pytest.fixture(scope="module", autouse=True)
def no_leftover_children():
    """Torn down last: by then every LLM of this module is shut down or deleted."""
    before = h.child_pids()
    yield
    gc.collect()
    assert h.wait_until(lambda: not (h.child_pids() - before), timeout=10), h.child_pids() - before
