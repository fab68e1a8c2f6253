"""Issue #35's sweep: under pure M4 (``dist.use_decentralized_pg=true``) the settings whose host paths still read
``parallel_state`` are refused at config time with one line, graphs on or off, and only under pure M4
(:func:`bridge_cudagraph.plan.checks.check_decentralized`, run first by ``check_run``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge_cudagraph.config import CudaGraphConfigError, cuda_graph_config_from_dict

ROOT = Path(__file__).resolve().parents[3]

# (id, (section, field, value), fragments the one-line message must contain)
CASES = [
    ("mtp", ("model", "mtp_num_layers", 1), ["model.mtp_num_layers=1", "parallel_state", "mtp_num_layers=null"]),
    (
        "timeout-after-init",
        ("dist", "distributed_timeout_seconds_after_init", 600),
        ["dist.distributed_timeout_seconds_after_init=600", "no group would get it", "null"],
    ),
    (
        "gtp",
        ("model", "gtp_weight_remat_size", 2),
        ["model.gtp_weight_remat_size=2", "model.tensor_parallel_num_weight_shards"],
    ),
    (
        "expert-gtp",
        ("model", "expert_gtp_weight_remat_size", 2),
        ["model.expert_gtp_weight_remat_size=2", "expert_tensor_parallel_num_weight_shards"],
    ),
]


@pytest.fixture
def tiny_config(tmp_path):
    """The tiny Qwen3-VL recipe (pure M4 like every example), finalized by Bridge as ``train`` would."""
    from megatron.bridge.training.config import runtime_config_update

    from bridge_cudagraph.examples.tiny_recipe import tiny_qwen3_vl_config

    cfg = tiny_qwen3_vl_config(checkpoint_dir=str(tmp_path / "ckpt"))
    cfg.model.cuda_graph = cuda_graph_config_from_dict({"language": {"enabled": True}, "vision": {"enabled": True}})
    runtime_config_update(cfg)
    assert cfg.dist.use_decentralized_pg
    return cfg


@pytest.mark.parametrize("graphs", ["on", "off"])
@pytest.mark.parametrize(("name", "setting", "fragments"), CASES, ids=[c[0] for c in CASES])
def test_pure_m4_refuses_what_reads_parallel_state(tiny_config, record, name, setting, fragments, graphs):
    from bridge_cudagraph.plan.checks import check_run

    if graphs == "off":
        tiny_config.model.cuda_graph = cuda_graph_config_from_dict({})
    section, field, value = setting
    object.__setattr__(getattr(tiny_config, section), field, value)
    with pytest.raises(CudaGraphConfigError) as info:
        check_run(tiny_config)
    text = str(info.value)
    record(graphs=graphs, message=text)
    assert "\n" not in text, text
    for fragment in fragments:
        assert fragment in text, (fragment, text)

    object.__setattr__(tiny_config.dist, "use_decentralized_pg", False)  # parallel_state exists then: accepted
    check_run(tiny_config)


def test_the_cli_says_it_in_one_line(capsys, monkeypatch):
    """``validate`` of a bundled recipe with the override: exit 2, one ``error:`` line, no traceback."""
    from bridge_cudagraph.cli import main

    monkeypatch.chdir(ROOT)
    code = main(["validate", "recipes/tiny_qwen3_vl.yaml", "dist.distributed_timeout_seconds_after_init=600"])
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and out == "" and len(errors) == 1, (code, out, err)
    assert "dist.distributed_timeout_seconds_after_init=600" in errors[0] and "Traceback" not in err, err
