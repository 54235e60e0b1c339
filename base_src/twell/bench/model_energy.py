"""GPU energy over a window of work, for ``twell bench model`` (energy per token).

Two sources, tried in this order when the meter is created:

1. NVML's cumulative board energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules, Volta and
   later) through ``pynvml`` when it imports: the difference of two readings, no sampling error.
2. ``nvidia-smi --query-gpu=power.draw.instant`` (or ``power.draw`` on drivers without the instant field)
   sampled every 50 ms by a background process while the work runs; energy = mean sampled power x
   elapsed time.  ``power.draw`` is a one-second average on recent drivers, so the window should be
   several seconds long (``--energy-seconds``).

Without either (no CUDA, no NVML, no nvidia-smi) energy is reported as unavailable, with the reason.
Both measure the whole board, idle power included, as the published mJ/token figures do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from .model_measure import synchronize

__all__ = ["EnergyMeter"]

_SMI_FIELDS = ("power.draw.instant", "power.draw")
_SMI_PERIOD_MS = 50


def _device_selector(device: torch.device) -> str:
    """The physical GPU behind ``device`` as NVML / nvidia-smi name it: an index or a UUID."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = [e.strip() for e in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
    return visible[index] if index < len(visible) else str(index)


class EnergyMeter:
    """Measures the energy of running a function repeatedly (see the module docs).

    ``method`` is ``"nvml"``, ``"nvidia-smi:<field>"`` or None (then ``reason`` says why).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.method: str | None = None
        self.reason = ""
        self._nvml: Any = None
        self._handle: Any = None
        if device.type != "cuda":
            self.reason = f"no energy counter on device type {device.type!r}"
            return
        selector = _device_selector(device)
        reasons = []
        try:
            import pynvml

            pynvml.nvmlInit()
            if selector.isdigit():
                handle = pynvml.nvmlDeviceGetHandleByIndex(int(selector))
            else:
                handle = pynvml.nvmlDeviceGetHandleByUUID(selector)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            self._nvml, self._handle, self.method = pynvml, handle, "nvml"
            return
        except Exception as exc:  # noqa: BLE001 - optional dependency, any failure means "try the next source"
            reasons.append(f"pynvml: {type(exc).__name__}: {exc}")
        smi = shutil.which("nvidia-smi")
        if smi is None:
            reasons.append("nvidia-smi: not on PATH")
        else:
            for fld in _SMI_FIELDS:
                try:
                    probe = subprocess.run(
                        [smi, f"--query-gpu={fld}", "--format=csv,noheader,nounits", "-i", selector],
                        capture_output=True, text=True, timeout=20, check=False,
                    )
                    float(probe.stdout.strip().splitlines()[0])
                except Exception as exc:  # noqa: BLE001 - unsupported field or driver: try the next
                    reasons.append(f"nvidia-smi {fld}: {type(exc).__name__}: {exc}")
                    continue
                self._smi_cmd = [smi, f"--query-gpu={fld}", "--format=csv,noheader,nounits", "-i", selector,
                                 "-lms", str(_SMI_PERIOD_MS)]
                self.method = f"nvidia-smi:{fld}"
                return
        self.reason = "; ".join(reasons)

    def measure(self, fn: Callable[[], Any], *, min_seconds: float) -> dict[str, Any]:
        """Call ``fn`` back to back until ``min_seconds`` have passed (at least once); return
        ``joules``, ``seconds``, ``calls``, ``mean_watts`` and ``method``.  Raises RuntimeError if no source."""
        if self.method is None:
            raise RuntimeError(f"energy unavailable: {self.reason}")
        if self.method == "nvml":
            synchronize(self.device)
            e0 = self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            seconds, calls = self._run(fn, min_seconds)
            joules = (self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) - e0) / 1e3
        else:
            joules, seconds, calls = self._measure_sampled(fn, min_seconds)
        return {"joules": joules, "seconds": seconds, "calls": calls, "mean_watts": joules / seconds,
                "method": self.method}

    def _run(self, fn: Callable[[], Any], min_seconds: float) -> tuple[float, int]:
        synchronize(self.device)
        t0 = time.perf_counter()
        calls = 0
        while True:
            fn()
            calls += 1
            # Synchronise only when the host clock says the window may be over: the queue stays full.
            if time.perf_counter() - t0 >= min_seconds:
                synchronize(self.device)
                if time.perf_counter() - t0 >= min_seconds:
                    break
        return time.perf_counter() - t0, calls

    def _measure_sampled(self, fn: Callable[[], Any], min_seconds: float) -> tuple[float, float, int]:
        samples: list[tuple[float, float]] = []
        proc = subprocess.Popen(self._smi_cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    samples.append((time.perf_counter(), float(line.strip())))
                except ValueError:
                    continue

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            deadline = time.perf_counter() + 5.0
            while not samples and time.perf_counter() < deadline:
                time.sleep(0.01)
            t0 = time.perf_counter()
            seconds, calls = self._run(fn, min_seconds)
            t1 = t0 + seconds
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
            reader.join(timeout=5)
        inside = [w for t, w in samples if t0 <= t <= t1]
        if len(inside) < 2:
            raise RuntimeError(f"only {len(inside)} power samples in a {seconds:.2f} s window; raise --energy-seconds")
        return sum(inside) / len(inside) * seconds, seconds, calls
