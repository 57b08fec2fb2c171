"""One transient workspace for every call, instead of an allocation per call.

Modules are compiled with `--iree-torch-externalize-transients` (pock_mlir.iree_flags): each
function takes, after its tensors, a `!hal.buffer` for the intermediate values of its dispatches,
and records the bytes it needs in its reflection. Without it, IREE's local-task driver allocated
that slab on every call and kept the previous call's slab mapped as well (two slabs per step:
see the bench's peak memory, bench/results.md). The Trainer allocates one
buffer of the largest size its functions need and passes it to each call (calls run one at a
time). iree-run-module passes one as `--input="&<bytes>xi8"` (bundle run_step.sh).
"""

from __future__ import annotations

from functools import cache

import iree.runtime as rt
import numpy as np

SIZE_KEY = "iree.abi.transients.size.constant"
MAPPABLE = int(rt.BufferUsage.MAPPING_SCOPED)  # a buffer the host reads by mapping it (CPU drivers)


def transient_bytes(vm_module, function: str) -> int | None:
    """The workspace bytes `function` needs; None if the module was compiled without
    externalized transients (then the function takes no workspace argument)."""
    entry = vm_module.lookup_function(f"{function}$async")
    size = None if entry is None else entry.reflection.get(SIZE_KEY)
    return None if size is None else int(size)


def module_transient_bytes(vmfb: bytes, function: str) -> int | None:
    """transient_bytes of a function in a serialized module (for bundles and the profiler)."""
    return transient_bytes(rt.VmModule.copy_buffer(rt.VmInstance(), vmfb), function)


class Workspace:
    """The one device buffer every call shares, grown to the largest size a loaded module's
    functions need (None until one needs any)."""

    def __init__(self, device: rt.HalDevice):
        self._device = device
        self.bytes: int | None = None
        self.buffer = None

    def reserve(self, size: int | None) -> None:
        if size is not None and (self.bytes is None or size > self.bytes):
            self.buffer = self._device.allocator.allocate_buffer(
                memory_type=int(rt.MemoryType.DEVICE_LOCAL),
                allowed_usage=int(rt.BufferUsage.DEFAULT),
                allocation_size=max(size, 1),
            )
            self.bytes = size


class ModuleFunctions:
    """A module's functions, called with device arrays and returning device arrays, each call
    given the workspace (shared with other modules', or one of its own) when the function takes one."""

    def __init__(
        self,
        context: rt.SystemContext,
        device: rt.HalDevice,
        names: tuple[str, ...],
        workspace: Workspace | None = None,
    ):
        workspace = workspace or Workspace(device)
        self._context, self._device, self._workspace = context, device, workspace
        vm_module = context.modules.module.vm_module
        self._functions = {name: vm_module.lookup_function(name) for name in names}
        sizes = {name: transient_bytes(vm_module, name) for name in names}
        self._takes_workspace = {name: size is not None for name, size in sizes.items()}
        for size in sizes.values():
            workspace.reserve(size)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._functions)

    def arguments(self, name: str, args) -> rt.VmVariantList:
        """The argument list of a call of `name` with the device arrays `args`: invoke takes it as
        often as those arrays are its arguments (an invocation leaves it as it was)."""
        arguments = rt.VmVariantList(len(args) + 1)
        for array in args:
            arguments.push_ref(array._buffer_view)  # DeviceArray has no public accessor for its buffer view
        if self._takes_workspace[name]:
            arguments.push_ref(self._workspace.buffer)
        return arguments

    def invoke(self, name: str, arguments: rt.VmVariantList) -> list[rt.DeviceArray]:
        results = rt.VmVariantList(8)
        self._context.vm_context.invoke(self._functions[name], arguments, results)
        return [rt.DeviceArray(self._device, results.get_as_object(i, rt.HalBufferView)) for i in range(results.size)]

    def __call__(self, name: str, *args: rt.DeviceArray) -> list[rt.DeviceArray]:
        return self.invoke(name, self.arguments(name, args))


class BatchSlots:
    """One device array per batch tensor, which every call's batch is written into, where the
    device's memory is host memory (CPU drivers: buffers the host maps, see MAPPABLE): a copy into
    a buffer mapped once costs less than allocating and filling one per call, and a call's arguments
    stay the same buffers from step to step. None of `arrays` where the device's memory is not
    (there each call uploads its batch)."""

    def __init__(self, device: rt.HalDevice, specs):
        self.arrays, self._views = [], []
        for spec in specs:
            dtype = np.dtype(spec.dtype)
            array = rt.asdevicearray(device, np.zeros(spec.shape, dtype))
            if not array._buffer_view.get_buffer().allowed_usage() & MAPPABLE:
                self.arrays, self._views = None, None
                return
            self.arrays.append(array)
            self._views.append(array._buffer_view.map().asarray(spec.shape, dtype))

    def write(self, index: int, values: np.ndarray) -> rt.DeviceArray:
        """Slot `index` holding `values` (of its dtype and shape); calls run one at a time, so the
        call that read its previous values has finished."""
        self._views[index][...] = values
        return self.arrays[index]


class LossSlot:
    """The buffer train_step_into writes its loss into (passes/pock_step_into.py). Where the
    device's memory is host memory (CPU drivers, see MAPPABLE) it is mapped once, so a step's loss
    is read with a load, not with a mapping of a buffer IREE allocated for the call; elsewhere it
    is copied back (to_host)."""

    def __init__(self, device: rt.HalDevice, spec):
        self._device = device
        self.array = rt.asdevicearray(device, np.zeros(spec.shape, np.dtype(spec.dtype)))
        mappable = self.array._buffer_view.get_buffer().allowed_usage() & MAPPABLE
        self._view = self.array._buffer_view.map().asarray(spec.shape, np.dtype(spec.dtype)) if mappable else None

    def read(self) -> float:
        """The loss of the last call that wrote it (calls run one at a time: it has finished)."""
        return float(self._view if self._view is not None else to_host(self._device, self.array))


@cache
def _host_dtype(element_type: rt.HalElementType) -> np.dtype:
    """The numpy dtype of an IREE element type, remembered: DeviceArray.dtype derives it anew,
    a microsecond of every step's loss read."""
    return np.dtype(rt.HalElementType.map_to_dtype(element_type))


def to_host(device: rt.HalDevice, array: rt.DeviceArray) -> np.ndarray:
    """A host copy of a device array."""
    # DeviceArray has no public accessor for its buffer.
    view = array._buffer_view
    shape, dtype = view.shape, _host_dtype(view.element_type)
    buffer = view.get_buffer()
    if buffer.allowed_usage() & MAPPABLE:  # CPU drivers: map the buffer and copy it
        return np.array(view.map().asarray(shape, dtype))
    # to_host() would import a numpy allocation into the driver, which lavapipe rejects
    # (minImportedHostPointerAlignment 4096): copy through a staging buffer the driver allocates.
    staging = device.allocator.allocate_buffer(
        memory_type=int(rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE),
        allowed_usage=int(rt.BufferUsage.TRANSFER_TARGET | rt.BufferUsage.MAPPING_SCOPED),
        allocation_size=buffer.byte_length(),
    )
    semaphore = device.create_semaphore(0)
    device.queue_copy(
        buffer,
        staging,
        wait_semaphores=rt.HalFence.create_at(semaphore, 0),
        signal_semaphores=rt.HalFence.create_at(semaphore, 1),
    )
    rt.HalFence.create_at(semaphore, 1).wait()
    return np.array(staging.map().asarray(shape, dtype))
