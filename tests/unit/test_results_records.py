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

The records of superseded runs live in ``results/archive/superseded-runs.tar.xz`` under the paths they had in the
tree (``results/runNN/...``, ``results/device_calls/runNN.sh``): they are read from there and held to the same rules.
Kept runs sit in the folder of the claim they support (``results/<claim>/runNN/``).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
from functools import cache
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "results"
ARCHIVE = RESULTS / "archive" / "superseded-runs.tar.xz"


@cache
def _archived() -> dict[str, bytes]:
    """Every file of the archive, by its path relative to ``results/`` (as it was in the tree)."""
    files = {}
    with tarfile.open(ARCHIVE, "r:xz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                files[member.name.removeprefix("results/")] = tar.extractfile(member).read()
    return files


def _is_record(name: str) -> bool:
    return name.endswith(".json") or name.endswith(".json.gz")


TREE = sorted(str(p.relative_to(RESULTS)) for p in RESULTS.rglob("*") if p.is_file() and _is_record(p.name))
RECORDS = TREE + sorted(f"archive:{name}" for name in _archived() if _is_record(name))


def _bytes(name: str) -> bytes:
    return _archived()[name.removeprefix("archive:")] if name.startswith("archive:") else (RESULTS / name).read_bytes()


def _load(name: str):
    raw = _bytes(name)
    if name.endswith(".gz"):
        raw = gzip.GzipFile(fileobj=io.BytesIO(raw)).read()
    return json.loads(raw.decode())


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())


def test_there_are_records():
    assert len(RECORDS) > 100, RECORDS
    assert len(TREE) > 50 and len(RECORDS) - len(TREE) > 50, (len(TREE), len(RECORDS))


@pytest.mark.parametrize("path", RECORDS)
def test_every_record_parses_and_says_when_on_what_and_how(path):
    try:
        data = _load(path)
    except (ValueError, OSError) as error:
        pytest.fail(f"{path} is not valid JSON: {error}")
    assert isinstance(data, dict) and isinstance(data.get("meta"), dict), f"{path}: no top-level meta"
    meta = data["meta"]
    assert _text(meta.get("date")), f"{path}: meta.date {meta.get('date')!r}"
    assert _text(meta.get("command")), f"{path}: meta.command {meta.get('command')!r}"
    gpus = meta.get("gpus")
    if "gpu" in meta and meta["gpu"] is None:
        command = meta["command"]
        assert "tests/unit" in command and "tests/gpu" not in command, f"{path}: gpu null for a GPU command"
    else:
        assert _text(meta.get("gpu")) or (isinstance(gpus, list) and gpus and all(_text(g) for g in gpus)), (
            f"{path}: no GPU named (meta.gpu {meta.get('gpu')!r}, meta.gpus {gpus!r})"
        )
    unknown = [k for k in ("date", "gpu", "command") if str(meta.get(k, "")).lower().startswith("unknown")]
    if unknown:
        sources = meta.get("sources")
        assert isinstance(sources, list) and sources and all(_text(s) for s in sources), (
            f"{path}: {unknown} unknown, and meta.sources does not say where it was looked for"
        )
    if "command_recorded" in meta:
        assert _text(meta.get("command_source")) and meta["command_recorded"] != meta["command"], path


def _device_calls() -> dict[str, str]:
    """run name -> the text of its ``device_calls/runNN.sh``, kept in the tree or archived."""
    scripts = {p.stem: p.read_text() for p in (RESULTS / "device_calls").glob("run*.sh")}
    for name, raw in _archived().items():
        match = re.fullmatch(r"device_calls/(run\w+)\.sh", name)
        if match:
            scripts[match.group(1)] = raw.decode()
    return scripts


def _run_records(run: str) -> list[str]:
    """The top-level ``gpu_*.json`` of a run's folder: ``results/<claim>/runNN/`` in the tree or ``runNN/`` in the
    archive."""
    found = [str(p.relative_to(RESULTS)) for folder in RESULTS.glob(f"*/{run}") for p in folder.glob("gpu_*.json")]
    found += [f"archive:{n}" for n in _archived() if re.fullmatch(rf"{run}/gpu_[^/]*\.json", n)]
    return sorted(found)


def test_pytest_records_name_the_command_their_device_call_ran():
    """From run 14 on, the pytest records named pytest's own arguments only; the step's environment (deterministic
    kernels, the teardown wave's endings) is part of what was run. Every record a ``device_calls/runNN.sh`` step wrote
    (``BRIDGE_CUDAGRAPH_RESULTS=$LOGS/<name>``) carries that step's command, the deterministic ones
    (``*_det.json``) with ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=0``."""
    corrected = []
    for run, text in sorted(_device_calls().items()):
        for path in _run_records(run):
            name = path.rsplit("/", 1)[-1]
            if f"$LOGS/{name}" not in text:
                continue
            meta = _load(path)["meta"]
            environment = meta.get("environment")
            if environment is not None:  # recorded with its environment (conftest does since run 62)
                if name.endswith("_det.json"):
                    assert environment.get("NVTE_ALLOW_NONDETERMINISTIC_ALGO") == "0", (path, environment)
                continue
            assert meta["command"].split()[0] != "pytest", (path, meta["command"])
            assert meta.get("command_source", "").startswith(f"results/device_calls/{run}.sh, step "), path
            corrected.append((int(run[3:5]), path))
            if name.endswith("_det.json"):
                assert "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0" in meta["command"], (path, meta["command"])
    assert len([p for n, p in corrected if 14 <= n <= 25]) == 25, corrected
    assert len(corrected) >= 78, len(corrected)
