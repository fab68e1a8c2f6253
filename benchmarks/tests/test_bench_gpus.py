"""bench_gpus: splitting the matrix over GPUs, the children's command lines and environments, and the
orchestration with a fake child command (one finishes, one crashes, one hangs), with nothing a child wrote lost."""

from __future__ import annotations

import json
import os
import sys
import textwrap

import pytest

from benchmarks import bench, bench_gpus
from benchmarks import configs as bench_configs


def test_split_of_the_full_matrix_over_two_gpus():
    groups = bench_gpus.split_configs(bench_configs.full_configs(), 2)
    names = [[c.name for c in g] for g in groups]
    # The heaviest shares its GPU only with the cheapest small configuration; the two mid-weight ones are together.
    assert names == [
        ["small-mbs1-seq2048", "small-mbs2-seq4096"],
        ["tiny", "small-mbs2-seq2048", "small-mbs1-seq4096"],
    ]
    loads = [sum(bench_gpus.estimated_cost(c) for c in g) for g in groups]
    assert max(loads) / min(loads) < 1.1


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_split_covers_every_config_once_and_balances(n):
    configs = bench_configs.full_configs()
    groups = bench_gpus.split_configs(configs, n)
    assert len(groups) == min(n, len(configs))
    flat = [c.name for g in groups for c in g]
    assert sorted(flat) == sorted(c.name for c in configs)
    for g in groups:  # cheapest first within a group
        costs = [bench_gpus.estimated_cost(c) for c in g]
        assert costs == sorted(costs)
    heaviest = max(configs, key=bench_gpus.estimated_cost)
    if n >= 3:
        assert [heaviest.name] in [[c.name for c in g] for g in groups]  # alone on its GPU
    loads = [sum(bench_gpus.estimated_cost(c) for c in g) for g in groups]
    # Greedy longest-first: no group exceeds the average by more than one configuration's cost.
    assert max(loads) <= sum(loads) / len(loads) + max(bench_gpus.estimated_cost(c) for c in configs)
    assert bench_gpus.split_configs(configs, n) == groups  # deterministic


def test_split_rejects_zero_groups():
    with pytest.raises(ValueError):
        bench_gpus.split_configs(bench_configs.full_configs(), 0)


def test_estimated_cost_grows_with_tokens():
    assert bench_gpus.tokens_per_step(bench_configs.small_config(2, 4096)) == 8192
    costs = [bench_gpus.estimated_cost(c) for c in bench_configs.full_configs()]
    assert costs == sorted(costs)  # the matrix is listed cheapest first


def test_resolve_devices():
    assert bench_gpus.resolve_devices(2, None, None) == ["0", "1"]
    assert bench_gpus.resolve_devices(2, None, "3,5,7") == ["3", "5"]
    assert bench_gpus.resolve_devices(None, "1, 0", "3,5") == ["1", "0"]
    assert bench_gpus.resolve_devices(None, ["2"], None) == ["2"]
    with pytest.raises(ValueError, match="lists only 1"):
        bench_gpus.resolve_devices(2, None, "4")
    with pytest.raises(ValueError, match="distinct"):
        bench_gpus.resolve_devices(None, "0,0", None)
    with pytest.raises(ValueError, match="positive"):
        bench_gpus.resolve_devices(0, None, None)


def test_child_argv_and_env(tmp_path):
    ns = bench._parse(["--gpus", "2", "--time-limit", "50", "--measured-steps", "7", "--no-profile", "--no-control"])
    argv = bench_gpus.child_argv(ns, ["tiny", "small-mbs1-seq2048"], tmp_path / "p0")
    assert argv[:3] == [sys.executable, "-m", "benchmarks.bench"]
    child = bench._parse(argv[3:])  # the child's own parser accepts it, and it runs in-process
    assert child.configs == "tiny,small-mbs1-seq2048" and child.out == str(tmp_path / "p0")
    assert child.measured_steps == 7 and child.warmup_steps == 3
    assert child.no_profile and child.no_control and child.variants == "eager,upstream,ours"
    assert child.gpus is None and child.devices is None and child.time_limit is None
    base = {"PATH": "/bin", "RANK": "3", "MASTER_PORT": "29500", "LOCAL_RANK": "3"}
    env = bench_gpus.child_env(base, "1", 4321)
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and env["MASTER_PORT"] == "4321" and env["PATH"] == "/bin"
    assert "RANK" not in env and "LOCAL_RANK" not in env
    assert len(set(bench_gpus._free_ports(4))) == 4


def test_cpu_sets_are_contiguous_disjoint_and_cover_every_cpu():
    assert bench_gpus.cpu_sets(range(32), 2) == [list(range(16)), list(range(16, 32))]
    assert bench_gpus.cpu_sets([0, 1, 2, 3, 8, 9, 10], 3) == [[0, 1, 2], [3, 8], [9, 10]]
    assert bench_gpus.cpu_sets([0, 1], 3) == [[], [], []]  # fewer CPUs than children: no pinning
    with pytest.raises(ValueError, match="at least one"):
        bench_gpus.cpu_sets([0], 0)


def test_cpu_list_is_tasksets_notation():
    assert bench_gpus.cpu_list([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert bench_gpus.cpu_list([]) == ""


def test_child_env_sizes_openmp_to_the_pinned_cpus():
    assert bench_gpus.child_env({}, "0", 1, [4, 5, 6])["OMP_NUM_THREADS"] == "3"
    assert bench_gpus.child_env({"OMP_NUM_THREADS": "1"}, "0", 1, [4, 5, 6])["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in bench_gpus.child_env({}, "0", 1)


def test_collect_children_marks_what_a_child_did_not_finish(tmp_path):
    ok = bench_gpus.Child(0, "0", ["tiny", "small-mbs2-seq4096"], tmp_path / "a", [], returncode=1)
    ok.out_dir.mkdir()
    ok.json_path.write_text(
        json.dumps(
            {
                "meta": {"gpu": "H200", "command": "child 0", "measured_steps": 30},
                "configs": [
                    {"name": "small-mbs2-seq4096", "status": "complete", "variants": {"ours": {"status": "failed"}}},
                    {"name": "tiny", "variants": {}},  # no status: an older bench, finished
                ],
            }
        )
    )
    ok.log_path.write_text("line\n" * 100 + "last line\n")
    dead = bench_gpus.Child(1, "1", ["small-mbs1-seq2048"], tmp_path / "b", [], timed_out=True, seconds=12.0)
    data = bench_gpus.collect_children(
        [ok, dead], order=["tiny", "small-mbs1-seq2048", "small-mbs2-seq4096"], meta={"command": "parent", "x": 1}
    )
    assert [c["name"] for c in data["configs"]] == ["tiny", "small-mbs1-seq2048", "small-mbs2-seq4096"]
    # rc 1 of child 0 came after its configurations finished (ours failed): they are not marked.
    assert data["configs"][2]["status"] == "complete" and data["configs"][0].get("status") is None
    missing = data["configs"][1]
    assert missing["status"] == "failed" and "timed out after 12 s" in missing["error"]
    assert missing["log_tail"] == ""  # child 1 left no log
    assert data["meta"]["command"] == "parent" and data["meta"]["gpu"] == "H200" and data["meta"]["x"] == 1
    assert [c["status"] for c in data["meta"]["children"]] == ["exit code 1", "timed out after 12 s"]
    assert bench_gpus.log_tail(ok.log_path, 2) == "line\nlast line"


# ------------------------------------------------------------------------------------------ several GPUs: processes
_FAKE_CHILD = textwrap.dedent(
    """
    import argparse, json, os, signal, sys, time
    p = argparse.ArgumentParser()
    p.add_argument("--out"); p.add_argument("--configs"); p.add_argument("--mode")
    a = p.parse_args()
    names = a.configs.split(",")
    os.makedirs(a.out, exist_ok=True)
    env = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MASTER_PORT", "RANK", "OMP_NUM_THREADS")}
    env["cpus"] = sorted(os.sched_getaffinity(0))

    def config(name, status):
        eager = {"status": "ok", "step_ms_median": 9.0}
        return {"name": name, "status": status, "env": env, "variants": {"eager": eager}}

    def write(configs):
        with open(os.path.join(a.out, "bench.json"), "w") as f:
            json.dump({"meta": {"gpu": "fake GPU", "command": "child"}, "configs": configs}, f)

    if a.mode == "ok":
        write([config(n, "complete") for n in names])
    elif a.mode == "fail":
        print("boom: CUDA error: an illegal memory access was encountered", flush=True)
        sys.exit(3)
    elif a.mode == "partial":  # finishes its first configuration, hangs in the second, ignores SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        write([config(names[0], "complete"), config(names[1], "running")])
        print("hanging in", names[1], flush=True)
        time.sleep(120)
    """
)


def test_run_on_gpus_merges_what_the_children_left(tmp_path):
    """Three fake children: one finishes, one crashes, one hangs (past the time limit, ignoring SIGTERM) after
    finishing one configuration and half of another. Nothing is lost that a child wrote."""
    script = tmp_path / "fake_child.py"
    script.write_text(_FAKE_CHILD)
    modes = {"small-mbs2-seq4096": "ok", "small-mbs1-seq2048": "fail", "tiny": "partial"}

    def make_argv(names, out_dir):
        return [
            sys.executable,
            str(script),
            "--out",
            str(out_dir),
            "--configs",
            ",".join(names),
            "--mode",
            modes[names[0]],
        ]

    env = {**os.environ, "RANK": "5", "MASTER_PORT": "1"}
    out = tmp_path / "bench"
    data, children = bench_gpus.run_on_gpus(
        bench_configs.full_configs(),
        ["4", "5", "6"],
        out_dir=out,
        make_argv=make_argv,
        time_limit_s=3.0,
        command="bench --gpus 3",
        env=env,
        poll_s=0.05,
        grace_s=0.5,
    )
    assert [c.configs for c in children] == [
        ["small-mbs2-seq4096"],
        ["small-mbs1-seq2048", "small-mbs2-seq2048"],
        ["tiny", "small-mbs1-seq4096"],
    ]
    assert [c.status() for c in children][:2] == ["ok", "exit code 3"]
    assert children[2].timed_out and children[2].returncode is not None  # killed after SIGTERM was ignored
    assert data == json.loads((out / "bench.json").read_text())
    by_name = {c["name"]: c for c in data["configs"]}
    assert [c["name"] for c in data["configs"]] == [c.name for c in bench_configs.full_configs()]
    assert by_name["small-mbs2-seq4096"]["status"] == "complete"
    assert by_name["tiny"]["status"] == "complete"
    for name in ("small-mbs1-seq2048", "small-mbs2-seq2048"):
        assert by_name[name]["status"] == "failed" and "exit code 3" in by_name[name]["error"]
        assert "boom: CUDA error" in by_name[name]["log_tail"]
    half = by_name["small-mbs1-seq4096"]
    assert half["status"] == "incomplete" and "timed out" in half["error"]
    assert half["variants"]["eager"]["step_ms_median"] == 9.0  # the variant it finished is kept
    assert "hanging in small-mbs1-seq4096" in half["log_tail"]
    # Each child saw only its GPU, a port of its own, and no launcher rank.
    envs = {c["name"]: c["env"] for c in data["configs"] if "env" in c}
    assert envs["small-mbs2-seq4096"]["CUDA_VISIBLE_DEVICES"] == "4"
    assert envs["tiny"]["CUDA_VISIBLE_DEVICES"] == "6"
    assert envs["tiny"]["MASTER_PORT"] != envs["small-mbs2-seq4096"]["MASTER_PORT"] != "1"
    assert all(e["RANK"] is None for e in envs.values())
    # ... and its own share of the CPUs, with an OpenMP pool no wider (unless the caller's environment set one).
    shares = bench_gpus.cpu_sets(sorted(os.sched_getaffinity(0)), 3)
    if all(shares):
        assert envs["small-mbs2-seq4096"]["cpus"] == shares[0] and envs["tiny"]["cpus"] == shares[2]
        assert [c["cpus"] for c in data["meta"]["children"]] == [bench_gpus.cpu_list(c) for c in shares]
        if "OMP_NUM_THREADS" not in env:
            assert envs["tiny"]["OMP_NUM_THREADS"] == str(len(shares[2]))
    assert data["meta"]["command"] == "bench --gpus 3" and data["meta"]["gpu"] == "fake GPU"
    assert (out / "part0-gpu4" / "bench.log").exists()
    md = (out / "bench.md").read_text()
    assert "This configuration did not run" in md and "boom: CUDA error" in md
    assert "stopped before every variant finished" in md
    assert "Split over 3 processes, one per GPU: GPU 4: small-mbs2-seq4096 (ok" in md


def test_two_gpu_script_is_a_thin_wrapper():
    path = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "bench_two_gpus.sh")
    text = open(path).read()
    assert "-m benchmarks.bench" in text and "--gpus 2" in text and '"${1:-results/bench}"' in text
    assert os.access(path, os.X_OK)
