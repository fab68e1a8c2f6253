"""Every record under ``results/`` is valid JSON and says when, on what and how it was made (issue #35).

Twelve result JSONs once carried no ``meta`` at all, two were not valid JSON (a probe's stdout with megatron-core's
prints in front), and runs 14-25 recorded ``pytest <args>`` without the environment of the step that ran them. So,
for every ``results/**/*.json`` and ``results/**/*.json.gz``:

* it parses, and is an object with a ``meta`` object;
* ``meta.date`` and ``meta.command`` are non-empty strings, and the GPU is named: ``meta.gpu`` a non-empty string,
  or ``meta.gpus`` a non-empty list of them (the two-GPU runner), or ``meta.gpu`` null for a CPU run (a command that
  runs ``tests/unit`` only: ``bad_configs.json``);
* a field that could not be recovered reads ``"unknown..."`` and ``meta.sources`` says where it was looked for;
* a command corrected from a device call keeps the one first recorded (``command_recorded``) and names the call
  (``command_source``), and every pytest record a ``device_calls/runNN.sh`` step wrote is corrected so.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "results"
RECORDS = sorted([*RESULTS.rglob("*.json"), *RESULTS.rglob("*.json.gz")])


def _load(path: Path):
    if path.name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            return json.load(f)
    return json.loads(path.read_text())


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def test_there_are_records():
    assert len(RECORDS) > 100, RECORDS


@pytest.mark.parametrize("path", RECORDS, ids=[str(p.relative_to(RESULTS)) for p in RECORDS])
def test_every_record_parses_and_says_when_on_what_and_how(path):
    try:
        data = _load(path)
    except (ValueError, OSError) as error:
        pytest.fail(f"{path.relative_to(RESULTS)} is not valid JSON: {error}")
    assert isinstance(data, dict) and isinstance(data.get("meta"), dict), f"{path.name}: no top-level meta"
    meta = data["meta"]
    assert _text(meta.get("date")), f"{path.name}: meta.date {meta.get('date')!r}"
    assert _text(meta.get("command")), f"{path.name}: meta.command {meta.get('command')!r}"
    gpus = meta.get("gpus")
    if "gpu" in meta and meta["gpu"] is None:
        command = meta["command"]
        assert "tests/unit" in command and "tests/gpu" not in command, f"{path.name}: gpu null for a GPU command"
    else:
        assert _text(meta.get("gpu")) or (isinstance(gpus, list) and gpus and all(_text(g) for g in gpus)), (
            f"{path.name}: no GPU named (meta.gpu {meta.get('gpu')!r}, meta.gpus {gpus!r})"
        )
    unknown = [k for k in ("date", "gpu", "command") if str(meta.get(k, "")).lower().startswith("unknown")]
    if unknown:
        sources = meta.get("sources")
        assert isinstance(sources, list) and sources and all(_text(s) for s in sources), (
            f"{path.name}: {unknown} unknown, and meta.sources does not say where it was looked for"
        )
    if "command_recorded" in meta:
        assert _text(meta.get("command_source")) and meta["command_recorded"] != meta["command"], path.name


def test_pytest_records_name_the_command_their_device_call_ran():
    """From run 14 on, the pytest records named pytest's own arguments only; the step's environment (deterministic
    kernels, the teardown wave's endings) is part of what was run. Every record a ``device_calls/runNN.sh`` step wrote
    (``BRIDGE_CUDAGRAPH_RESULTS=$LOGS/<name>``) carries that step's command, the deterministic ones
    (``*_det.json``) with ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``."""
    corrected = []
    for script in sorted((RESULTS / "device_calls").glob("run*.sh")):
        run = script.stem
        text = script.read_text()
        for path in sorted((RESULTS / run).glob("gpu_*.json")):
            if f"$LOGS/{path.name}" not in text:
                continue
            meta = _load(path)["meta"]
            environment = meta.get("environment")
            if environment is not None:  # recorded with its environment (conftest does since run 62)
                if path.name.endswith("_det.json"):
                    assert environment.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == "0", (path, environment)
                continue
            assert meta["command"].split()[0] != "pytest", (path, meta["command"])
            assert meta.get("command_source", "").startswith(f"results/device_calls/{run}.sh, step "), path
            corrected.append(path)
            if path.name.endswith("_det.json"):
                assert "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0" in meta["command"], (path, meta["command"])
    assert len([p for p in corrected if 14 <= int(p.parent.name[3:5]) <= 25]) == 25, corrected
    assert len(corrected) >= 78, len(corrected)
