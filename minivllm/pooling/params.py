"""PoolingParams: how one pooling request's vector is finished (vLLM's names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

from minivllm.config.model import Range

RANGES = {"dimensions": Range(low=1), "truncate_prompt_tokens": Range(low=1)}
"""The allowed values of the numeric fields (None passes); the server's schema declares them too."""


@dataclass
class PoolingParams:
    dimensions: Optional[int] = None
    """Keep the first ``dimensions`` entries (Matryoshka models only), before normalizing."""
    normalize: Optional[bool] = None
    """L2-normalize the vector; None follows ``model.pooler_config.normalize``."""
    truncate_prompt_tokens: Optional[int] = None
    """Keep only the last k prompt tokens (k >= 1)."""

    def __post_init__(self) -> None:
        for name in ("dimensions", "truncate_prompt_tokens"):
            value = getattr(self, name)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise ValueError(f"{name}={value!r}: must be an integer >= 1 or None")
                RANGES[name].check(name, value)
        if self.normalize is not None and not isinstance(self.normalize, bool):
            raise ValueError(f"normalize={self.normalize!r}: must be true, false or None")

    def check(self, hf_config: Any, hidden_size: int) -> None:
        """The checks that need the model: ``dimensions`` needs a Matryoshka model and fits its width."""
        if self.dimensions is None:
            return
        if not (getattr(hf_config, "is_matryoshka", False) or getattr(hf_config, "matryoshka_dimensions", None)):
            raise ValueError(
                f"dimensions={self.dimensions}: this model does not support Matryoshka representations "
                f"(its config sets neither is_matryoshka nor matryoshka_dimensions)"
            )
        allowed = getattr(hf_config, "matryoshka_dimensions", None)
        if allowed and self.dimensions not in allowed:
            raise ValueError(f"dimensions={self.dimensions}: must be one of {sorted(allowed)}")
        if self.dimensions > hidden_size:
            raise ValueError(f"dimensions={self.dimensions}: must be at most the hidden size {hidden_size}")

    def finish(self, pooled: torch.Tensor, default_normalize: bool) -> torch.Tensor:
        """(H,) pooled hidden state -> the request's vector (fp32)."""
        out = pooled.float()
        if self.dimensions is not None:
            out = out[: self.dimensions]
        if default_normalize if self.normalize is None else self.normalize:
            out = torch.nn.functional.normalize(out, p=2, dim=-1)
        return out
