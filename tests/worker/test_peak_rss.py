"""The CPU memory profile measures the profile's own peak: not an earlier peak of
the process, and not the parent's (which ``ru_maxrss`` inherits through spawn).

The memory is mapped here with ``mmap`` rather than taken from malloc: a CPU worker
that ran earlier in this process may have set glibc to keep freed memory in its heap
(``distributed/utils.py: keep_freed_pages``), and an allocation served from those
already-resident pages would neither raise the peak nor return to the OS when freed."""

from __future__ import annotations

import mmap
import resource

from minivllm.worker.worker import _peak_rss_bytes, _reset_peak_rss, _rss_bytes

MiB = 1 << 20


def _touched(nbytes: int) -> mmap.mmap:
    """``nbytes`` of fresh anonymous memory, every page written (resident)."""
    block = mmap.mmap(-1, nbytes)
    page = b"\x01" * mmap.PAGESIZE
    for offset in range(0, nbytes, mmap.PAGESIZE):
        block[offset : offset + mmap.PAGESIZE] = page
    return block


def test_reset_forgets_an_earlier_peak():
    block = _touched(400 * MiB)  # touch 400 MiB, then unmap it
    block.close()
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - _rss_bytes() > 300 * MiB
    _reset_peak_rss()
    assert _peak_rss_bytes() - _rss_bytes() < 50 * MiB


def test_peak_sees_growth_after_the_reset():
    _reset_peak_rss()
    before = _rss_bytes()
    block = _touched(200 * MiB)
    assert _peak_rss_bytes() - before > 150 * MiB
    block.close()
