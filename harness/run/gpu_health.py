"""Each GPU's health beside its timing: NVML (nvidia-ml-py) read on a thread of its own.

A GPU throttled by temperature or power, or held at a lower clock, is the commonest hardware
straggler: its rank runs the same code as its peers, slower. The thread reads the rank's GPU once
every `period_s` (1 s: NVML's clock and power counters are themselves averages over about that
long), keeps the latest reading whole, and the step record takes it as it is (one dict merge per
step, no NVML call on the step path). The run's row keeps what the readings add up to in fixed
space: a count per SM clock value, the highest temperature, every throttle reason seen.

Without nvidia-ml-py, NVML or a CUDA device the fields are absent and nothing else changes.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch

PERIOD_S = 1.0
# NVML's clock event ("throttle") reasons that slow a busy GPU (nvml.h,
# nvmlClocksEventReason*): bit -> the word the report uses. GpuIdle (0x1), the applications
# clocks setting (0x2) and the display clock (0x100) are left out: an idle GPU or a clock the
# administrator set is not a slowdown of the rank's work.
THROTTLE_REASONS = {
    0x4: "power",  # software power cap
    0x8: "hardware slowdown",  # HW slowdown: temperature or power brake, reported by the board
    0x10: "sync boost",  # held to the clock of the GPUs it is boost-synced with
    0x20: "temperature",  # software thermal slowdown
    0x40: "temperature",  # hardware thermal slowdown
    0x80: "power",  # hardware power brake
}
FIELDS = (
    "gpu_sm_clock_mhz",
    "gpu_max_sm_clock_mhz",
    "gpu_power_w",
    "gpu_temp_c",
    "gpu_util_pct",
    "gpu_throttle",
    "gpu_throttled",
    "gpu_ecc_uncorrected",
)


def throttle_reasons(mask: int) -> list[str]:
    """The slowdown reasons set in an NVML clock-event mask, each word once, in bit order."""
    words: list[str] = []
    for bit, word in THROTTLE_REASONS.items():
        if mask & bit and word not in words:
            words.append(word)
    return words


def read_health(nvml: Any, handle: Any) -> dict[str, Any]:
    """One reading of a GPU through the `nvml` module (pynvml's API): the step record's gpu_*
    fields; a counter this GPU does not have (NVML_ERROR_NOT_SUPPORTED) is left out."""
    out: dict[str, Any] = {}

    def read(key: str, call: Any) -> None:
        try:
            out[key] = call()
        except nvml.NVMLError:
            pass

    read("gpu_sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)))
    read("gpu_max_sm_clock_mhz", lambda: int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)))
    read("gpu_power_w", lambda: round(nvml.nvmlDeviceGetPowerUsage(handle) / 1e3, 1))  # NVML: milliwatts
    read("gpu_temp_c", lambda: int(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)))
    read("gpu_util_pct", lambda: int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
    # nvidia-ml-py 12.535+ names it ClocksEventReasons; older ones only ClocksThrottleReasons
    reasons = (
        getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    )
    read("gpu_throttle", lambda: throttle_reasons(int(reasons(handle))))
    read(
        "gpu_ecc_uncorrected",
        lambda: int(
            nvml.nvmlDeviceGetTotalEccErrors(handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)
        ),
    )
    if "gpu_throttle" in out:
        out["gpu_throttled"] = int(bool(out["gpu_throttle"]))
    return out


class GpuHealth:
    """The rank's GPU read every `period_s` on a daemon thread (module docstring); `latest` is
    the last reading ({} without NVML), replaced whole, so a step reads one reading, never a mix.
    `open` finds the GPU of a torch device; this constructor takes NVML and the GPU's handle."""

    def __init__(self, nvml: Any = None, handle: Any = None, period_s: float = PERIOD_S, why_off: str | None = None):
        self.latest: dict[str, Any] = {}
        self.why_off = why_off
        self._clocks: Counter[int] = Counter()
        self._temp_max: int | None = None
        self._throttle_seen: set[str] = set()
        self._ecc_max: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml, self._handle = nvml, handle
        if nvml is None:
            return
        self._read()
        self._thread = threading.Thread(target=self._loop, args=(period_s,), name="harness-gpu-health", daemon=True)
        self._thread.start()

    @classmethod
    def open(cls, device: torch.device, period_s: float = PERIOD_S) -> GpuHealth:
        """The reader of `device`'s GPU, or one with no readings (`why_off` says why)."""
        if device.type != "cuda":
            return cls(why_off="not a CUDA device")
        try:
            import pynvml

            pynvml.nvmlInit()
            # by UUID: CUDA's device numbering (CUDA_VISIBLE_DEVICES) need not be NVML's
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        except Exception as exc:  # noqa: BLE001 - no nvidia-ml-py, no driver, another vendor: no health fields
            return cls(why_off=f"{type(exc).__name__}: {exc}")
        return cls(pynvml, handle, period_s)

    def _loop(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self._read()

    def _read(self) -> None:
        try:
            reading = read_health(self._nvml, self._handle)
        except Exception:  # noqa: BLE001 - a reading that fails is skipped; the previous one stands
            return
        self.latest = reading
        if "gpu_sm_clock_mhz" in reading:
            self._clocks[reading["gpu_sm_clock_mhz"]] += 1
        if "gpu_temp_c" in reading:
            self._temp_max = max(self._temp_max or reading["gpu_temp_c"], reading["gpu_temp_c"])
        self._throttle_seen.update(reading.get("gpu_throttle", []))
        if "gpu_ecc_uncorrected" in reading:
            self._ecc_max = max(self._ecc_max or 0, reading["gpu_ecc_uncorrected"])

    def summary(self) -> dict[str, Any]:
        """The run's row fields: the median SM clock of the readings, the highest temperature,
        every throttle reason seen, the uncorrected ECC errors; {} without readings."""
        if not self._clocks and self._temp_max is None:
            return {}
        return {
            "gpu_sm_clock_mhz_p50": _median_of_counts(self._clocks),
            "gpu_temp_c_max": self._temp_max,
            "gpu_throttle_seen": sorted(self._throttle_seen),
            "gpu_ecc_uncorrected": self._ecc_max,
        }

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * PERIOD_S)
            self._thread = None
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001, S110 - the process is ending its run
                pass


def _median_of_counts(counts: Counter[int]) -> int | None:
    """The lower median of values given as value -> count."""
    total = sum(counts.values())
    if not total:
        return None
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if 2 * seen >= total:
            return value
    return None
