"""The CPU memory profile measures the profile's own peak: not an earlier peak of
the process, and not the parent's (which ``ru_maxrss`` inherits through spawn)."""

from __future__ import annotations

import resource

import numpy as np

from minivllm.worker.worker import _peak_rss_bytes, _reset_peak_rss, _rss_bytes

MiB = 1 << 20


def test_reset_forgets_an_earlier_peak():
    block = np.ones(400 * MiB, dtype=np.uint8)  # touch 400 MiB, then free it
    del block
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - _rss_bytes() > 300 * MiB
    _reset_peak_rss()
    assert _peak_rss_bytes() - _rss_bytes() < 50 * MiB


def test_peak_sees_growth_after_the_reset():
    _reset_peak_rss()
    before = _rss_bytes()
    block = np.ones(200 * MiB, dtype=np.uint8)
    assert _peak_rss_bytes() - before > 150 * MiB
    del block
