"""GPU readings through NVML (`pynvml`); every `NVMLError` is translated here.

MiB are floored (`bytes // 2**20`), never overstating free memory; memory is read with
`nvmlDeviceGetMemoryInfo_v2` where present, so `total` may exceed `used + free` by the
driver's reserved memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol, TypeVar

from anvil_ctl.core.errors import AdapterError, TransientError, Unavailable
from anvil_ctl.core.model import GpuProcess, GpuReading
from anvil_ctl.log import get_logger

MIB = 2**20

log = get_logger()

T = TypeVar("T")

# NVML return codes by the name pynvml gives them; looked up on the module in use
# so that a fake module only needs the codes it raises.
_UNAVAILABLE = (
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_NO_PERMISSION",
)
_TRANSIENT = ("NVML_ERROR_TIMEOUT", "NVML_ERROR_NOT_READY", "NVML_ERROR_IN_USE")
# The v2 memory call or per-process accounting may be missing on old drivers,
# vGPU guests or WSL; we degrade instead of failing.
_UNSUPPORTED = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
)

_HINT = "set ANVIL_GPU=simulated on a machine without NVIDIA GPUs"


class MemoryInfo(Protocol):
    """What `nvmlDeviceGetMemoryInfo` returns (v1 or v2): bytes."""

    @property
    def total(self) -> int: ...
    @property
    def used(self) -> int: ...
    @property
    def free(self) -> int: ...


class ProcessInfo(Protocol):
    """One entry of `nvmlDeviceGetComputeRunningProcesses` (`usedGpuMemory` may be None)."""

    @property
    def pid(self) -> int: ...


class Nvml(Protocol):
    """The part of the `pynvml` module this probe calls (a device handle is opaque to us)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetUUID(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /, version: int = ...) -> MemoryInfo: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object, /) -> Sequence[ProcessInfo]: ...


class NvmlUnavailable(Unavailable):
    """NVML cannot be used on this host: no NVIDIA driver, no NVML library, or no GPU (exit 7)."""

    def __init__(self, message: str, **data: object) -> None:
        super().__init__(message, dependency="nvml", **data)


def mib(value_bytes: int) -> int:
    """Bytes to MiB, floored (nvidia-smi may print 1 MiB more; see the module docstring)."""
    return int(value_bytes) // MIB


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlProbe:
    """NVML readings of every GPU by UUID, init and shutdown per call (no handle held)."""

    def __init__(self, nvml: Nvml | None = None) -> None:
        self._nvml = nvml

    def _module(self) -> Nvml:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")  # untyped: this adapter's edge
            except ImportError as exc:
                raise NvmlUnavailable(
                    f"the pynvml module (PyPI nvidia-ml-py) is not installed; {_HINT}"
                ) from exc
        return self._nvml

    def _codes(self, names: tuple[str, ...]) -> set[int]:
        nvml = self._module()
        return {getattr(nvml, n) for n in names if hasattr(nvml, n)}

    def _translate(self, call: str, exc: Exception) -> AdapterError:
        code = getattr(exc, "value", None)
        detail = f"NVML {call}: {exc}"
        if code in self._codes(_UNAVAILABLE):
            return NvmlUnavailable(
                f"NVML is not usable on this host ({exc}); is the NVIDIA driver installed? {_HINT}",
                call=call,
                nvml_code=code,
            )
        if code in self._codes(_TRANSIENT):
            return TransientError(detail, dependency="nvml", call=call, nvml_code=code)
        return AdapterError(detail, call=call, nvml_code=code)

    def _call(self, call: str, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        nvml = self._module()
        try:
            return fn(*args, **kwargs)
        except nvml.NVMLError as exc:
            raise self._translate(call, exc) from exc

    @contextmanager
    def _session(self) -> Iterator[Nvml]:
        nvml = self._module()
        self._call("init", nvml.nvmlInit)
        try:
            yield nvml
        finally:
            try:
                nvml.nvmlShutdown()
            except nvml.NVMLError as exc:  # a failed shutdown must not hide the result
                log.warning("nvml.shutdown_failed", error=str(exc))

    def driver_version(self) -> str:
        with self._session() as nvml:
            return _text(self._call("driver version", nvml.nvmlSystemGetDriverVersion))

    def gpus(self) -> list[GpuReading]:
        """Every GPU NVML sees, ordered by NVML index; raises NvmlUnavailable if there is none."""
        with self._session() as nvml:
            count = int(self._call("device count", nvml.nvmlDeviceGetCount))
            if count == 0:
                raise NvmlUnavailable(f"NVML sees no GPU on this host; {_HINT}")
            return [self._reading(nvml, i) for i in range(count)]

    def _reading(self, nvml: Nvml, index: int) -> GpuReading:
        handle = self._call(f"handle of GPU {index}", nvml.nvmlDeviceGetHandleByIndex, index)
        uuid = _text(self._call(f"UUID of GPU {index}", nvml.nvmlDeviceGetUUID, handle))
        name = _text(self._call(f"name of {uuid}", nvml.nvmlDeviceGetName, handle))
        memory = self._memory(nvml, handle, uuid)
        return GpuReading(
            uuid=uuid,
            name=name,
            index=index,
            total_mib=mib(memory.total),
            used_mib=mib(memory.used),
            free_mib=mib(memory.free),
            processes=self._processes(nvml, handle, uuid),
        )

    def _memory(self, nvml: Nvml, handle: object, uuid: str) -> MemoryInfo:
        version = getattr(nvml, "nvmlMemory_v2", None)
        if version is not None:
            try:
                return nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except nvml.NVMLError as exc:
                if getattr(exc, "value", None) not in self._codes(_UNSUPPORTED):
                    raise self._translate(f"memory of {uuid}", exc) from exc
                log.info("nvml.memory_v1_fallback", gpu=uuid, error=str(exc))
        return self._call(f"memory of {uuid}", nvml.nvmlDeviceGetMemoryInfo, handle)

    def _processes(self, nvml: Nvml, handle: object, uuid: str) -> tuple[GpuProcess, ...]:
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) not in self._codes(_UNSUPPORTED):
                raise self._translate(f"processes of {uuid}", exc) from exc
            log.warning("nvml.processes_unsupported", gpu=uuid, error=str(exc))
            return ()
        # usedGpuMemory None: the driver does not account per process; 0 MiB keeps the PID visible.
        out = [GpuProcess(int(p.pid), mib(getattr(p, "usedGpuMemory", None) or 0)) for p in procs]
        return tuple(sorted(out, key=lambda p: p.pid))
