"""Structured config schemas: one dataclass per Hydra config group, each in its own file.

Every field has a default, a type and a one-line docstring (the docstring under
the field; `tools/gen_config_docs.py` reads them). Choices are checked in
``__post_init__`` so a bad value fails when the config is built, naming the key.
OmegaConf has no ``Literal`` type, so choices are plain ``str`` fields with an
allowed set next to them. This module gathers the groups and their allowed sets;
the root that holds them is ``vllm_config.VllmConfig``.
"""

from minivllm.config.cache_config import CACHE_DTYPES, CacheConfig
from minivllm.config.execution import (
    ATTENTION_BACKENDS,
    DEVICE_TYPES,
    LOAD_FORMATS,
    AttentionConfig,
    CompilationConfig,
    DeviceConfig,
    LoadConfig,
)
from minivllm.config.model_config import (
    DTYPE_ALIASES,
    MODALITIES,
    MODEL_DTYPES,
    POOLING_TYPES,
    RUNNERS,
    ModelConfig,
    PoolerConfig,
)
from minivllm.config.parallel_config import DP_BACKENDS, PARALLEL_BACKENDS, PLACEMENT_STRATEGIES, ParallelConfig
from minivllm.config.scheduler_config import SCHEDULER_POLICIES, SchedulerConfig
from minivllm.config.task_config import TASKS, TaskConfig

__all__ = (  # group by group, in the tree's order
    ["ModelConfig", "PoolerConfig", "MODEL_DTYPES", "DTYPE_ALIASES", "RUNNERS", "MODALITIES", "POOLING_TYPES"]
    + ["ParallelConfig", "PARALLEL_BACKENDS", "DP_BACKENDS", "PLACEMENT_STRATEGIES"]
    + ["CacheConfig", "CACHE_DTYPES", "SchedulerConfig", "SCHEDULER_POLICIES"]
    + ["LoadConfig", "LOAD_FORMATS", "CompilationConfig", "AttentionConfig", "ATTENTION_BACKENDS"]
    + ["DeviceConfig", "DEVICE_TYPES", "TaskConfig", "TASKS"]
)
