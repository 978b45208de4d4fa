"""Kernel groups of a decode profile: sampler kernels by the profiler range they ran in,
the rest by name; CUDA-graph kernels (claimed by no CPU op) counted from the device's records."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from minivllm.bench.kernel_groups import SAMPLER_RANGE, KernelTime, cpu_ops, device_kernels, group_of, summarize


@dataclass
class _Event:
    name: str
    device_type: str = "DeviceType.CPU"
    kernels: list = field(default_factory=list)
    cpu_parent: "_Event | None" = None
    us: float = 0.0
    is_user_annotation: bool = False

    @property
    def time_range(self):
        return SimpleNamespace(elapsed_us=lambda: self.us)


def _kernel(name: str, us: float):
    return SimpleNamespace(name=name, device=0, duration=us)


def _device(name: str, us: float, annotation: bool = False) -> _Event:
    return _Event(name, device_type="DeviceType.CUDA", us=us, is_user_annotation=annotation)


@pytest.mark.parametrize(
    "name, group",
    [
        ("_paged_attention_kernel", "attention"),
        ("_combine_splits_kernel", "attention"),
        ("_write_kv_kernel", "attention"),
        ("nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "gemm"),
        ("aten::addmm", "gemm"),
        ("_rms_norm_kernel", "small ops"),
        ("_rotary_kernel", "small ops"),
        ("Memcpy HtoD (Pinned -> Device)", "copies"),
        ("void at::native::vectorized_elementwise_kernel<4>", "small ops"),
    ],
)
def test_kernels_are_grouped_by_name(name, group):
    assert group_of(KernelTime(name, 1.0)) == group


def test_device_kernels_split_sampler_and_count_graph_replays_once():
    sampler = _Event(SAMPLER_RANGE)
    softmax = _Event(
        "aten::softmax",
        kernels=[_kernel("softmax_warp_forward", 5.0)],
        cpu_parent=_Event("aten::x", cpu_parent=sampler),
    )
    mm = _Event("aten::mm", kernels=[_kernel("nvjet_hsh_128x256", 20.0)])
    events = [
        sampler,
        softmax,
        mm,
        _device("softmax_warp_forward", 5.0),
        _device("nvjet_hsh_128x256", 20.0),
        _device("_paged_attention_kernel", 30.0),  # replayed in a graph: no CPU op claims it
        _device("Memcpy HtoD (Pinned -> Device)", 2.0),
        _device(SAMPLER_RANGE, 100.0, annotation=True),
    ]
    summary = summarize(device_kernels(events), steps=2)
    ms = {g: round(v["ms_per_step"] * 1e3, 3) for g, v in summary["groups"].items()}
    assert ms == {"attention": 15.0, "gemm": 10.0, "sampler": 2.5, "small ops": 0.0, "copies": 1.0}
    assert summary["kernel_ms_per_step"] == pytest.approx(57e-3 / 2)
    assert [k["name"] for k in summary["top"]] == [
        "_paged_attention_kernel",
        "nvjet_hsh_128x256",
        "softmax_warp_forward",
        "Memcpy HtoD (Pinned -> Device)",
    ]
    assert summary["top"][0]["percent"] == pytest.approx(100 * 30 / 57)


def test_cpu_ops_inside_the_sampler_range_of_a_real_profile():
    x = torch.randn(64, 64)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        y = x @ x
        with torch.profiler.record_function(SAMPLER_RANGE):
            torch.argmax(torch.softmax(y, dim=-1), dim=-1)
    groups = {(k.name, group_of(k)) for k in cpu_ops(prof.events())}
    assert ("aten::mm", "gemm") in groups
    assert ("aten::argmax", "sampler") in groups
    assert not any(name == "aten::mm" and g == "sampler" for name, g in groups)
