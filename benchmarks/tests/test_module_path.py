"""benchmarks.module_path on the CPU: the hook over real calls into the package, and the way's summary."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

import bridge_cudagraph
from benchmarks.module_path import ModuleWay, summarize

pytestmark = pytest.mark.fast


def test_the_summary_counts_modules_and_the_folders_the_way_returns_to():
    way = ["cli", "plan/build", "plan/checks", "host/compat", "plan/build", "bridge/train", "plan/checks", "host/step"]
    got = summarize(way)
    assert got["module_count"] == 6
    assert got["modules"][1] == {"module": "plan/build", "entries": 2}
    # host/ does not count as leaving plan/; bridge/ then plan/ again is a return to plan/.
    assert got["folder_visits"] == [".", "plan", "bridge", "plan"]
    assert got["folder_returns"] == {"plan": 1}


def test_the_hook_records_calls_between_package_modules_until_the_first_replay():
    """Real calls into the package (the config loader, then the replay loop) under the real hook."""
    from bridge_cudagraph.capture import block_replay
    from bridge_cudagraph.config import cuda_graph_config_from_dict

    seen: list[list[str]] = []
    way = ModuleWay(Path(bridge_cudagraph.__file__).resolve().parent, lambda w: seen.append(list(w.entries)))
    way.start()
    try:
        cuda_graph_config_from_dict({"language": {"enabled": True}})
        # A rung of no segments: the loop runs no graph and hands the hidden states back.
        block = types.SimpleNamespace(config=types.SimpleNamespace(sequence_parallel=False), layers=[])
        assert block_replay.replay_segments(block, [], "h", (), []) == "h"
        cuda_graph_config_from_dict({})  # after the first replay: not recorded
    finally:
        way.stop()
    assert sys.monitoring.get_tool(ModuleWay.TOOL) is None  # given back
    assert way.done and len(seen) == 1
    assert seen[0][0] == "config" and seen[0][-1] == "capture/block_replay"
    assert way.entries == seen[0]


def test_a_record_names_its_machine_and_stack_even_when_train_stops_early(tmp_path, capsys, monkeypatch):
    """A ``train`` refused before any step (a bad setting) still leaves a ``module_path.json`` that says what it ran on
    (the GPU, None on this CPU, and the stack's versions) and how far it got, as every results/ record must."""
    import json

    from benchmarks import module_path

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main sets the train command's argv
    code = module_path.main(["recipes/tiny_qwen3_vl_photos.yaml", "--out", str(tmp_path), "model.seq_length=0"])
    assert code == 2 and "error: " in capsys.readouterr().err
    record = json.loads((tmp_path / "module_path.json").read_text())
    meta = record["meta"]
    assert set(meta) >= {"command", "date", "gpu", "torch", "megatron_core", "megatron_bridge", "transformer_engine"}
    assert meta["megatron_core"] and meta["megatron_bridge"] and record["replayed"] is False
    assert record["module_count"] >= 1
