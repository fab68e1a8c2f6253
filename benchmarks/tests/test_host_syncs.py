"""Where a host wait is attributed: the innermost frame outside torch, with two callers (CPU)."""

from __future__ import annotations

import os
import traceback

from benchmarks import host_syncs


def test_a_site_skips_torch_frames_and_names_two_callers():
    torch_file = os.path.join(host_syncs.torch_dir(), "nn", "modules", "module.py")
    stack = [
        traceback.FrameSummary("/work/benchmarks/bench.py", 10, "run"),
        traceback.FrameSummary("/work/bridge_cudagraph/testing/parity.py", 20, "train_steps"),
        traceback.FrameSummary(os.path.join("y", "site-packages", "megatron", "core", "m.py"), 30, "forward"),
        traceback.FrameSummary(torch_file, 40, "_call_impl"),
    ]
    site = host_syncs.frame_site(stack)
    assert site.startswith("megatron/core/m.py:30 forward <- ")
    assert "parity.py:20 train_steps" in site and "_call_impl" not in site
    assert host_syncs.frame_site([traceback.FrameSummary(torch_file, 1, "f")]) == "(no Python frame)"


def test_an_environment_under_a_torch_directory_still_names_megatron_and_bridge():
    """The device's environment lives in /opt/torch/.venv: a ``/torch/`` path part is in every installed package's
    path there, so matching it filtered Megatron's and Bridge's frames too and every site read as this repository's
    nearest frame. Only torch's own package directory is torch."""
    venv = "/opt/torch/.venv/lib/python3.12/site-packages"
    stack = [
        traceback.FrameSummary("/work/bridge_cudagraph/host/forward.py", 205, "forward"),
        traceback.FrameSummary(f"{venv}/megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py", 714, "forward"),
        traceback.FrameSummary(os.path.join(host_syncs.torch_dir(), "_tensor.py"), 9, "__setitem__"),
    ]
    site = host_syncs.frame_site(stack)
    assert site.startswith("megatron/bridge/models/qwen_vl/modelling_qwen3_vl/model.py:714 forward <- "), site
    assert not host_syncs.is_own_frame(f"{venv}/megatron/core/m.py", host_syncs.torch_dir())


def test_census_lines_name_each_recorded_variant_its_total_and_top_sites():
    variants = {
        "a": {"host_syncs": {"total": 5, "sites": [["x.py:1 f", 3], ["y.py:2 g", 1], ["z.py:3 h", 1]]}},
        "b": {"status": "ok"},  # no census: no line
        "c": {"host_syncs": {"total": 0, "sites": []}},  # no wait at all: said so, no sites
    }
    lines = host_syncs.census_lines(variants, ("a", "b", "c", "missing"), top=2)
    assert lines == [
        "- a: 5 host waits on the GPU in one step; most from: 3 x `x.py:1 f`; 1 x `y.py:2 g`.",
        "- c: 0 host waits on the GPU in one step.",
    ]
