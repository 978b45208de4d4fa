"""``minivllm/c_kernels.py``: a kernel library is built once, its functions get their signatures, and a
library whose build fails, or one it calls into, leaves ``get()`` None (the caller's torch path)."""

from __future__ import annotations

import ctypes
import shutil

import pytest

from minivllm.c_kernels import CLibrary

pytestmark = pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")

_SOURCE = "#include <stdint.h>\nvoid add_one(int64_t* x, int64_t n) { for (int64_t i = 0; i < n; ++i) x[i] += 1; }\n"


def test_built_once_with_its_signatures_and_callable_through_a_pointer(monkeypatch, tmp_path):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    lib = CLibrary("probe", _SOURCE, "nothing", {"add_one": [ctypes.c_void_p, ctypes.c_int64]})
    x = (ctypes.c_int64 * 3)(1, 2, 3)
    lib.get().add_one(ctypes.addressof(x), 3)
    assert list(x) == [2, 3, 4]
    assert len(list((tmp_path / "cpu_kernels").glob("probe_*.so"))) == 1
    by_pointer = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(lib.address("add_one"))
    by_pointer(ctypes.addressof(x), 3)
    assert list(x) == [3, 4, 5]
    again = CLibrary("probe", _SOURCE, "nothing", {"add_one": [ctypes.c_void_p, ctypes.c_int64]})
    monkeypatch.setenv("CC", "false")  # found built: no compiler needed
    assert again.get() is not None


def test_a_failed_build_and_a_failed_dependency_give_none(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    base = CLibrary("probe_base", _SOURCE, "the torch path runs", {"add_one": [ctypes.c_void_p, ctypes.c_int64]})
    assert base.get() is None
    assert "did not build" in caplog.text and "the torch path runs" in caplog.text
    monkeypatch.delenv("CC")
    user = CLibrary("probe_user", _SOURCE.replace("add_one", "add_two"), "x", {}, needs=(base,))
    assert user.get() is None  # built fine on its own, but it calls into a library that is not there
    assert not list((tmp_path / "cpu_kernels").glob("probe_user_*.so"))
