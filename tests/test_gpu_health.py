"""Each GPU's health beside its timing: NVML's readings (harness/run/gpu_health.py, with a
stand-in NVML module), and the collector naming a straggler's slower GPU from step logs that
carry them (harness/traces/analyse/gpu_health.py), with exact answers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from harness.run.gpu_health import GpuHealth, read_health, throttle_reasons
from harness.traces.analyse.gpu_health import GpuReading, gpu_findings
from harness.traces.analyse.memory import read_step_logs

from jobs import collect_quietly
from tracebuild import ring_docs, write


class NVMLError(Exception):
    pass


def fake_nvml(clock: list[int], mask: int = 0, ecc_supported: bool = True) -> Any:
    """pynvml's calls the reader makes, answering from `clock` (one value per reading, the last
    repeated) and `mask` (the clock-event reasons)."""
    readings = iter(clock)
    last = [clock[0]]

    def sm_clock(handle: Any, which: int) -> int:
        last[0] = next(readings, last[0])
        return last[0]

    def ecc(handle: Any, kind: int, counter: int) -> int:
        if not ecc_supported:
            raise NVMLError("Not Supported")
        return 0

    return SimpleNamespace(
        NVMLError=NVMLError,
        NVML_CLOCK_SM=1,
        NVML_TEMPERATURE_GPU=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlDeviceGetClockInfo=sm_clock,
        nvmlDeviceGetMaxClockInfo=lambda h, w: 1980,
        nvmlDeviceGetPowerUsage=lambda h: 412_345,  # mW
        nvmlDeviceGetTemperature=lambda h, w: 71,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=97, memory=40),
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: mask,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlShutdown=lambda: None,
    )


def test_throttle_reasons_are_the_slowdowns_only() -> None:
    assert throttle_reasons(0x1 | 0x2 | 0x100) == []  # idle, an applications clock, the display clock
    assert throttle_reasons(0x4 | 0x40 | 0x80) == ["power", "temperature"]
    assert throttle_reasons(0x20) == ["temperature"] and throttle_reasons(0x8) == ["hardware slowdown"]


def test_a_reading_holds_every_field_and_leaves_out_what_the_gpu_lacks() -> None:
    assert read_health(fake_nvml([1410], mask=0x40), "h") == {
        "gpu_sm_clock_mhz": 1410,
        "gpu_max_sm_clock_mhz": 1980,
        "gpu_power_w": 412.3,
        "gpu_temp_c": 71,
        "gpu_util_pct": 97,
        "gpu_throttle": ["temperature"],
        "gpu_ecc_uncorrected": 0,
        "gpu_throttled": 1,
    }
    assert "gpu_ecc_uncorrected" not in read_health(fake_nvml([1980], ecc_supported=False), "h")


def test_the_reader_runs_off_the_step_path_and_sums_up_in_fixed_space() -> None:
    health = GpuHealth(fake_nvml([1980, 1410, 1410, 1980, 1410], mask=0x4), "h", period_s=0.01)
    try:
        deadline = time.monotonic() + 30
        while health.summary().get("gpu_sm_clock_mhz_p50") != 1410 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert health.latest["gpu_sm_clock_mhz"] == 1410
    finally:
        health.close()
    summary = health.summary()
    assert summary["gpu_sm_clock_mhz_p50"] == 1410  # the readings hold more 1410s than 1980s
    assert summary["gpu_temp_c_max"] == 71 and summary["gpu_throttle_seen"] == ["power"]
    assert len(health._clocks) == 2  # a count per clock value, not a list of readings


def test_no_gpu_no_fields() -> None:
    health = GpuHealth.open(torch.device("cpu"))
    assert health.latest == {} and health.summary() == {} and health.why_off == "not a CUDA device"
    health.close()


def reading(clock: float, *throttle: str, temp: float = 70.0) -> GpuReading:
    return GpuReading(sm_clock_mhz=clock, throttle=throttle, temp_c=temp)


def test_a_straggler_s_slower_gpu_is_named_with_its_figures() -> None:
    steps = range(1, 7)
    logs = {r: {s: reading(1980.0 if r != 2 else 1410.0, temp=70.0) for s in steps} for r in range(4)}
    logs[2] = {s: reading(1410.0, "temperature", temp=89.0) for s in steps}
    logs[1] = {s: reading(1980.0, *(("power",) if s <= 2 else ())) for s in steps}  # 2 of 6 steps: not counted
    found = gpu_findings([2, 3], logs)
    assert list(found) == [2]  # rank 3, named a straggler too, ran at its peers' clock
    f = found[2]
    assert (f.sm_clock_mhz, f.peer_sm_clock_mhz, f.throttle, f.temp_c, f.peer_temp_c) == (
        1410.0,
        1980.0,
        ("temperature",),
        89.0,
        70.0,
    )
    said = "its GPU ran at 1.41 GHz against 1.98 GHz on its peers: throttled for temperature"
    assert f.text == said + " (89 C, its peers at most 70 C)"


def test_a_clock_within_the_drop_and_shared_reasons_say_nothing() -> None:
    steps = range(1, 5)
    near = {r: {s: reading(1980.0 if r else 1890.0) for s in steps} for r in range(3)}  # 4.5% lower: within 5%
    assert gpu_findings([0], near) == {}
    shared = {r: {s: reading(1980.0, "power") for s in steps} for r in range(3)}  # every rank power-capped
    assert gpu_findings([0], shared) == {}
    lower = {r: {s: reading(1980.0 if r else 1800.0) for s in steps} for r in range(3)}
    assert gpu_findings([0], lower)[0].text.endswith(
        "with no throttle reason set (a lower clock setting, or a slower part)"
    )
    # only the analysed steps count: rank 0 was throttled in steps 1-2, not in the window 3-4
    window = {r: {s: reading(1400.0 if (r == 0 and s <= 2) else 1980.0) for s in steps} for r in range(3)}
    assert gpu_findings([0], window, {r: {3, 4} for r in range(3)}) == {}
    assert 0 in gpu_findings([0], window, {r: {1, 2} for r in range(3)})


def _write_run(run: Path, n_ranks: int = 4, steps: int = 6) -> Path:
    """GPU traces where rank 2 computes 300 us longer a step than its peers, and step logs where
    its GPU ran at 1.41 GHz, throttled for temperature, against 1.98 GHz on its peers."""
    docs = ring_docs(lambda r, s: 800.0 if r == 2 else 500.0, n_ranks, steps)
    run.mkdir(parents=True)
    for r, d in enumerate(docs):
        write(run / f"rank{r}.pt.trace.json.gz", d)
    (run / "steps").mkdir()
    for r in range(n_ranks):
        with (run / "steps" / f"rank{r}.jsonl").open("w") as fh:
            for s in range(1, steps + 1):
                slow = r == 2
                rec = {
                    "step": s,
                    "step_ms": 1.0,
                    "gpu_sm_clock_mhz": 1410 if slow else 1980,
                    "gpu_temp_c": 89 if slow else 70,
                    "gpu_throttle": ["temperature"] if slow else [],
                    "gpu_throttled": int(slow),
                    "gpu_power_w": 400.0,
                }
                fh.write(json.dumps(rec) + "\n")
    return run


def test_the_collector_says_a_straggler_s_gpu_was_throttled(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run")
    logs = read_step_logs([run]).ranks
    assert logs[2].gpu[3] == GpuReading(sm_clock_mhz=1410.0, throttle=("temperature",), temp_c=89.0)
    proc = collect_quietly(run, "--output", str(tmp_path / "out"))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["rank"] for s in report["stragglers"]] == [2]
    assert report["stragglers"][0]["gpu"] == {
        "sm_clock_mhz": 1410.0,
        "peer_sm_clock_mhz": 1980.0,
        "throttle": ["temperature"],
        "temp_c": 89.0,
        "peer_temp_c": 70.0,
        "text": "its GPU ran at 1.41 GHz against 1.98 GHz on its peers: throttled for temperature "
        "(89 C, its peers at most 70 C)",
    }
    step = next(n for n in report["next_steps"] if n["about"] == "straggler")
    assert step["text"].startswith(
        "Rank 2: its GPU ran at 1.41 GHz against 1.98 GHz on its peers: throttled for temperature"
    ), step
    assert "throttled for temperature" in proc.stdout
    # the same run without the readings: named, with nothing said of its GPU
    for f in (run / "steps").iterdir():
        f.unlink()
    (run / "steps").rmdir()
    collect_quietly(run, "--output", str(tmp_path / "out"))
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [s["rank"] for s in report["stragglers"]] == [2] and report["stragglers"][0]["gpu"] is None


@pytest.mark.parametrize("mask", [0x40, 0x0])
def test_the_step_record_carries_the_latest_reading(mask: int) -> None:
    health = GpuHealth(fake_nvml([1500], mask=mask), "h", period_s=60)
    try:
        assert health.latest["gpu_throttled"] == int(bool(mask)) and health.latest["gpu_sm_clock_mhz"] == 1500
    finally:
        health.close()
