"""The config tree: schemas, the root VllmConfig, Hydra composition."""
from minivllm.config.schema import (
    AttentionConfig,
    CacheConfig,
    CompilationConfig,
    DeviceConfig,
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    TaskConfig,
)
from minivllm.config.store import build_config, compose, register_configs
from minivllm.config.vllm_config import ServeConfig, VllmConfig

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
    "compose",
    "register_configs",
]
