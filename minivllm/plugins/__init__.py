"""General plugins: code a separately installed package runs in every minivllm process.

A package declares a plugin as an entry point in the group
``minivllm.general_plugins`` (vLLM's ``vllm.general_plugins``), for example in
its ``pyproject.toml``::

    [project.entry-points."minivllm.general_plugins"]
    my_model = "my_pkg:register"        # def register() -> None

``load_general_plugins`` calls each one once per process: by a front end
(``LLM``, ``AsyncLLM.from_kwargs``, the CLI) just before it builds the config,
whose architecture check must see what a plugin registers (the config package
itself imports nothing from the engine, plugins included); by an engine core
that checks a model class for pipeline stages; and when a Worker is built in
each worker process (mp, Ray, external launcher), so a plugin may register an
out-of-tree model (``ModelRegistry.register_model``) or a class that a
``_target_`` then names. The config key ``plugins`` allow-lists
entry points by name (null: every installed one; []: none).

Which plugins this process has already called is kept here, per process: that
is the point of "once" (a second engine in the same process must not register
twice).
"""

from __future__ import annotations

import logging
from importlib.metadata import EntryPoint, entry_points
from typing import Sequence

logger = logging.getLogger(__name__)
PLUGIN_GROUP = "minivllm.general_plugins"
_called: set[str] = set()
"""Names of the plugins this process has called."""


def installed_plugins() -> dict[str, EntryPoint]:
    """Entry points in ``PLUGIN_GROUP`` visible on ``sys.path`` now, by name."""
    return {ep.name: ep for ep in entry_points(group=PLUGIN_GROUP)}


def load_general_plugins(allowed: Sequence[str] | None = None) -> list[str]:
    """Call each allowed plugin not yet called in this process; returns the names allowed.

    Raises ValueError (naming ``plugins``) when an allowed name is not
    installed, and RuntimeError naming the plugin when one fails to import or raises.
    """
    found = installed_plugins()
    if allowed is None:
        names = sorted(found)
    else:
        names = list(allowed)
        missing = [n for n in names if n not in found]
        if missing:
            raise ValueError(
                f"plugins={names}: {', '.join(map(repr, missing))} not installed in the group {PLUGIN_GROUP!r}; "
                f"installed: {', '.join(sorted(found)) or 'none'}"
            )
    for name in names:
        if name not in _called:
            _call(found[name])
            _called.add(name)
    return names


def _call(entry: EntryPoint) -> None:
    try:
        plugin = entry.load()
        plugin()
    except Exception as err:
        raise RuntimeError(
            f"plugin {entry.name!r} ({entry.value}, group {PLUGIN_GROUP!r}) failed: {type(err).__name__}: {err}"
        ) from err
    logger.info("loaded plugin %r (%s)", entry.name, entry.value)
