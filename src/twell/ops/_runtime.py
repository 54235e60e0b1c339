"""Which backend runs an op: Triton kernels on CUDA (or under the Triton interpreter), else PyTorch."""

from __future__ import annotations

import ctypes
import functools
import os

import torch

BACKENDS = ("auto", "torch", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # pragma: no cover - depends on the platform
        return False
    return True


def interpreting() -> bool:
    """True when Triton kernels run on the CPU through ``TRITON_INTERPRET=1``."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def kernels_run_on(device: torch.device) -> bool:
    """Whether a self-contained Triton helper kernel runs for tensors on ``device``: CUDA, or the CPU under Triton's
    interpreter, and never while torch.compile traces (the PyTorch expression then runs, which inductor fuses)."""
    if not triton_available() or torch.compiler.is_compiling():
        return False
    return device.type == "cuda" or (interpreting() and device.type == "cpu")


def resolve_backend(backend: str, device: torch.device) -> str:
    """Map ``auto`` to a concrete backend and refuse combinations that cannot run."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise RuntimeError("backend='triton' needs the triton package, which is not importable here")
        if device.type != "cuda" and not interpreting():
            raise ValueError(
                f"backend='triton' needs CUDA tensors (got device {device}); on the CPU set TRITON_INTERPRET=1 "
                "to run the kernels in Triton's interpreter, or use backend='torch'"
            )
    return backend


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for b > 0, Triton's ``triton.cdiv`` formula in plain Python.  The launchers' host code calls this
    instead: ``triton.cdiv`` is a ``ConstexprFunction``, whose every call unwraps its arguments through a list and a
    dict, and a hot/cold op call made ~10 of them (session 40's profile on the GPU machine, where issuing one op call
    took the host 442-957 us, bench_results/h200/session40_runs.md; with this, one read of the environment per launch
    and the module's eager launch, the module's hot/cold call went 97.5 -> 55.2 us on the development CPU with the
    launches stubbed, bench_results/cpu/module_overhead_session40_{before,after}.log)."""
    return (a + b - 1) // b


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (>= 1): block sizes of tl.arange must be powers of two."""
    return 1 << max(0, (n - 1).bit_length())


def tma_capable(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device whose Triton kernels can use TMA tensor descriptors (compute
    capability >= 9.0, Hopper on).  Off CUDA the interpreter runs them; callers decide for those."""
    if device.type != "cuda":
        return False
    return _capability(torch.cuda.current_device() if device.index is None else device.index)[0] >= 9


@functools.cache
def _capability(device_index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device_index)


@torch.compiler.assume_constant_result
def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """``(major, minor)`` compute capability of a CUDA device (its index, or the current device), None for any other
    device; cached per device.  Under torch.compile a constant of the graph, read when it is traced (a device's
    capability never changes, and the inputs' device is guarded).  None too where CUDA is not available (a
    ``"cuda"`` device named on a machine without one)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return _capability(torch.cuda.current_device() if device.index is None else device.index)


def sm_count(device_index: int | None = None) -> int:
    """Streaming multiprocessors of a CUDA device (None: the current one), cached per device: a persistent
    grid's program count, read at every launch."""
    return _properties(device_index).multi_processor_count


def l2_bytes(device_index: int | None = None) -> int:
    """L2 cache bytes of a CUDA device (None: the current one), cached per device."""
    return _properties(device_index).L2_cache_size


def _properties(device_index: int | None) -> torch.cuda._CudaDeviceProperties:
    return _cached_properties(torch.cuda.current_device() if device_index is None else device_index)


@functools.cache
def _cached_properties(device_index: int) -> torch.cuda._CudaDeviceProperties:
    return torch.cuda.get_device_properties(device_index)


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on ``device`` can be launched as programmatic dependents (``launch_pdl``, with
    ``griddepcontrol`` in the kernels): CUDA at compute capability >= 9.0, not under the interpreter."""
    return not interpreting() and tma_capable(device)


#: ``CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`` of the CUDA driver API (cuda.h's CUfunction_attribute).
_CARVEOUT_ATTRIBUTE = 9
_carveout_set: set[int] = set()


@functools.lru_cache(maxsize=1)
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def prefer_max_shared_carveout(kernel) -> None:
    """Ask the driver to configure the SMs that run ``kernel`` (a launched Triton ``CompiledKernel``) with all of their
    unified L1 / shared memory as shared memory, so that CTAs of another kernel fit beside its CTAs.  Applies from the
    kernel's next launch; once per loaded kernel.  Raises RuntimeError with the driver's CUresult if it refuses."""
    fn = getattr(kernel, "function", None)
    if not fn or fn in _carveout_set:
        return
    rc = _libcuda().cuFuncSetAttribute(ctypes.c_void_p(fn), ctypes.c_int(_CARVEOUT_ATTRIBUTE), ctypes.c_int(100))
    if rc != 0:
        raise RuntimeError(f"cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT, 100) failed: CUresult {rc}")
    _carveout_set.add(fn)
