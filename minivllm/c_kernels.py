"""The CPU's C kernels: compiled once for this machine, cached, loaded on first use.

Each kernel module (``attention/cpu_paged_decode.py``, ``layers/ops/cpu_fused.py``,
``quantization/cpu_small_gemm.py``, ``quantization/cpu_panel_gemm.py``,
``models/llama_cpu_decode.py``) holds its plain C source (no torch headers: it compiles in about a
second with the system's ``$CC`` or ``cc``) and one ``CLibrary`` naming its functions' signatures
and what runs instead where it cannot be built. The library is built under
``minivllm.utils.cache_dir("cpu_kernels")`` (``$MINIVLLM_CACHE_DIR``, default ``~/.cache/minivllm``),
keyed by its source, the flags and this CPU's instruction-set flags, so it is built for the machine
it runs on and a second process finds it built. Where no compiler is found or the build fails,
``get()`` returns None once (logged) and the caller keeps its torch path.

The kernels use OpenMP in the same runtime torch uses (they link ``libgomp.so.1``, which the loader
resolves to the copy torch already loaded), with ``torch.get_num_threads()`` threads.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from minivllm.utils import cache_dir

logger = logging.getLogger(__name__)

FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math", "-fPIC"]
"""Compile flags. Linking is a separate step without ``-ffast-math``, which would link in
``crtfastmath.o`` and flush denormals to zero for the whole process on load."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def build_c_library(stem: str, source: str, what: str) -> ctypes.CDLL | None:
    """Compile ``source`` (plain C) into a shared library with ``FLAGS`` for this machine, cached
    under ``cache_dir("cpu_kernels")`` as ``{stem}_{key}.so`` keyed by the source, flags and CPU flags;
    None (logged, naming ``what`` falls back) where no compiler is found or the build fails."""
    key = hashlib.sha256("\0".join([source, *FLAGS, _cpu_flags()]).encode()).hexdigest()[:16]
    path = cache_dir("cpu_kernels") / f"{stem}_{key}.so"
    if not path.exists():
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            logger.info("no C compiler found: %s", what)
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            src, obj, so = Path(tmp) / f"{stem}.c", Path(tmp) / f"{stem}.o", Path(tmp) / "out.so"
            src.write_text(source)
            proc = subprocess.run([cc, *FLAGS, "-c", str(src), "-o", str(obj)], capture_output=True, text=True)
            if proc.returncode == 0:
                link = [cc, "-shared", "-fopenmp", str(obj), "-o", str(so), "-lm"]
                proc = subprocess.run(link, capture_output=True, text=True)
            if proc.returncode != 0:
                logger.warning("the CPU kernel %s did not build (%s); %s", stem, proc.stderr, what)
                return None
            os.replace(so, path)  # atomic: processes building at once each install a whole file
    return ctypes.CDLL(str(path))


UNLOADED: Any = object()
"""``CLibrary.loaded`` before the first ``get()``."""


class CLibrary:
    """One kernel module's C library: built and loaded on the first ``get()``.

    ``functions`` maps each exported function to its argument types (``ctypes``; every one returns
    void); ``fallback`` says what runs where it cannot be built; ``needs``: libraries whose functions
    this one calls through pointers (it is None where any of them is)."""

    def __init__(
        self,
        stem: str,
        source: str,
        fallback: str,
        functions: dict[str, list[Any]],
        needs: tuple[CLibrary, ...] = (),
    ) -> None:
        self.stem, self.source, self.fallback = stem, source, fallback
        self.functions, self.needs = functions, needs
        self.loaded: ctypes.CDLL | None = UNLOADED
        """The library; None where it cannot be built; ``UNLOADED`` until the first ``get()``
        (tests set it back to build again)."""

    def get(self) -> ctypes.CDLL | None:
        if self.loaded is UNLOADED:
            self.loaded = self._load()
        return self.loaded

    def _load(self) -> ctypes.CDLL | None:
        if any(lib.get() is None for lib in self.needs):
            return None
        try:
            lib = build_c_library(self.stem, self.source, self.fallback)
        except OSError as err:
            logger.warning("the CPU kernel %s could not be loaded (%s); %s", self.stem, err, self.fallback)
            return None
        if lib is not None:
            for name, argtypes in self.functions.items():
                fn = getattr(lib, name)
                fn.argtypes, fn.restype = argtypes, None
        return lib

    def address(self, name: str) -> int:
        """Where the built function ``name`` lies (for a library that calls it through a pointer)."""
        return ctypes.cast(getattr(self.get(), name), ctypes.c_void_p).value


_NOT_PROFILED = contextlib.nullcontext()  # reusable: one object for every call outside a profile
_profiler_enabled = torch.autograd._profiler_enabled


def profiled(name: str) -> contextlib.AbstractContextManager:
    """A ``record_function`` range named ``name`` while torch's profiler runs (a C kernel called through
    ctypes is invisible to it otherwise); a shared no-op context otherwise, 6 us cheaper a call."""
    return torch.profiler.record_function(name) if _profiler_enabled() else _NOT_PROFILED
