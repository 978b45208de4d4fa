"""The config tree: schemas, the root VllmConfig, Hydra composition, vLLM's ``LLM(...)`` keywords.

The config describes; it never builds. This package imports nothing from the
engine's packages (core, engine, executor, worker, models, layers, ...), only the
standard library, torch, transformers, Hydra/OmegaConf and ``minivllm.utils``;
what needs the model itself comes back from the worker that loaded it
(``minivllm/kv_cache_spec.py``). ``tests/config/test_config_is_a_leaf.py`` keeps it so.

One module per config group (a dataclass each: every field has a default, a type
and a one-line docstring, which ``tools/gen_config_docs.py`` reads; choices are
checked in ``__post_init__``, naming the key), groups that share an idea sharing
a module named for it:

- ``model``: the ``model`` group, and what the checkpoint's config says (architectures,
  rope types, quantization); the key checks every group calls (``check_choice``, ``Range``)
- ``load``: the ``load`` group, and ``read_checkpoint``, the one step that reads disk
- ``parallel``, ``cache``, ``scheduler``, ``speculative``, ``lora``, ``kv_transfer``: the group of that name
- ``device``: the ``device``, ``attention`` and ``compilation`` groups
- ``task``: the ``task`` group and the keys of each task (``bench``, ``serve``, ``tune``)
- ``vllm_config``: the root, ``VllmConfig``, which validates and derives
- ``store``: Hydra's ConfigStore, ``compose`` and the model presets
- ``llm_kwargs``: vLLM's ``LLM(...)`` keywords mapped onto the tree
"""

from minivllm.config.cache import CacheConfig
from minivllm.config.device import AttentionConfig, CompilationConfig, DeviceConfig
from minivllm.config.llm_kwargs import config_from_kwargs
from minivllm.config.load import LoadConfig
from minivllm.config.model import ModelConfig
from minivllm.config.parallel import ParallelConfig
from minivllm.config.scheduler import SchedulerConfig
from minivllm.config.store import build_config, compose, register_configs
from minivllm.config.task import ServeConfig, TaskConfig
from minivllm.config.vllm_config import VllmConfig

__all__ = [
    "AttentionConfig",
    "CacheConfig",
    "CompilationConfig",
    "DeviceConfig",
    "LoadConfig",
    "ModelConfig",
    "ParallelConfig",
    "SchedulerConfig",
    "ServeConfig",
    "TaskConfig",
    "VllmConfig",
    "build_config",
    "config_from_kwargs",
    "compose",
    "register_configs",
]
