"""Worker extensions: a user's class whose methods every worker gains (vLLM's ``worker_extension_cls``).

``parallel.worker_extension_cls`` names a class (``"pkg.module.Class"`` or
``"pkg.module:Class"``). Each executor builds its workers through
``build_worker``, which makes the worker an instance of a subclass of both its
own class and the extension, so that ``LLM.collective_rpc("method", args=...)``
reaches the extension's methods on every rank, in every executor (uniproc, mp,
Ray, external launcher), with ``self`` the worker (``self.model_runner.model``
is the live model). The extension's ``__init__`` is not called: keep state in
attributes set by its methods.

An extension may not redefine a name the worker class has (``execute_model``,
``sleep``, ...): that is an error naming the clashing names, raised in the
driver before any worker starts (``check_worker_extension``).
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

from hydra.utils import get_class

from minivllm.config.vllm_config import VllmConfig
from minivllm.utils import instantiate_target


def resolve_extension(qualname: str) -> type:
    """The class ``qualname`` names; ValueError naming the key when it cannot be imported."""
    module_name, sep, attr = qualname.partition(":") if ":" in qualname else qualname.rpartition(".")
    if not module_name or not attr or not sep:
        raise ValueError(
            f"parallel.worker_extension_cls={qualname!r}: must be a qualified class name, 'pkg.module.Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"parallel.worker_extension_cls={qualname!r}: cannot import {module_name!r} ({err})") from err
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ValueError(f"parallel.worker_extension_cls={qualname!r}: {module_name!r} has no class {attr!r}")
    return cls


def extension_names(ext: type) -> set[str]:
    """Names the extension (and its own bases, ``object`` aside) defines, dunders aside."""
    names: set[str] = set()
    for klass in ext.__mro__:
        if klass is not object:
            names.update(n for n in vars(klass) if not (n.startswith("__") and n.endswith("__")))
    return names


def check_clashes(worker_cls: type, ext: type) -> None:
    clashes = sorted(n for n in extension_names(ext) if hasattr(worker_cls, n))
    if clashes:
        raise ValueError(
            f"parallel.worker_extension_cls={ext.__module__}.{ext.__qualname__}: defines {', '.join(clashes)}, "
            f"which {worker_cls.__qualname__} already has; rename them in the extension"
        )


def check_worker_extension(cfg: VllmConfig) -> None:
    """In the driver, before any worker starts: the extension imports and clashes with nothing."""
    qualname = cfg.parallel.worker_extension_cls
    if qualname:
        check_clashes(get_class(cfg.parallel.worker["_target_"]), resolve_extension(qualname))


@lru_cache(maxsize=None)
def extended_class(worker_cls: type, ext: type) -> type:
    """``worker_cls`` with ``ext``'s methods mixed in (one class per pair)."""
    check_clashes(worker_cls, ext)
    return type(f"{worker_cls.__name__}With{ext.__name__}", (worker_cls, ext), {"__module__": __name__})


def build_worker(cfg: VllmConfig, **kwargs: Any) -> Any:
    """``parallel.worker``'s class instantiated for one rank, extended by ``parallel.worker_extension_cls``."""
    worker = instantiate_target(cfg.parallel.worker, cfg=cfg, **kwargs)
    qualname = cfg.parallel.worker_extension_cls
    if qualname:
        worker.__class__ = extended_class(type(worker), resolve_extension(qualname))
    return worker
