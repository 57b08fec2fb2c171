"""One transient workspace for every call, instead of an allocation per call.

Modules are compiled with `--iree-torch-externalize-transients` (pock_mlir.targets): each
function takes, after its tensors, a `!hal.buffer` for the intermediate values of its dispatches,
and records the bytes it needs in its reflection. Without it, IREE's local-task driver allocated
that slab on every call and kept the previous call's slab mapped as well (two slabs per step:
see the bench's peak memory, bench/results.md). The Trainer allocates one
buffer of the largest size its functions need and passes it to each call (calls run one at a
time). iree-run-module passes one as `--input="&<bytes>xi8"` (bundle run_step.sh).
"""

from __future__ import annotations

import iree.runtime as rt

SIZE_KEY = "iree.abi.transients.size.constant"


def transient_bytes(vm_module, function: str) -> int | None:
    """The workspace bytes `function` needs; None if the module was compiled without
    externalized transients (then the function takes no workspace argument)."""
    entry = vm_module.lookup_function(f"{function}$async")
    size = None if entry is None else entry.reflection.get(SIZE_KEY)
    return None if size is None else int(size)


def module_transient_bytes(vmfb: bytes, function: str) -> int | None:
    """transient_bytes of a function in a serialized module (for bundles and the profiler)."""
    return transient_bytes(rt.VmModule.copy_buffer(rt.VmInstance(), vmfb), function)


class ModuleFunctions:
    """The module's functions, called with device arrays and returning device arrays, each call
    given the one shared workspace when the module takes one."""

    def __init__(self, context: rt.SystemContext, device: rt.HalDevice, names: tuple[str, ...]):
        self._context, self._device = context, device
        vm_module = context.modules.module.vm_module
        self._functions = {name: vm_module.lookup_function(name) for name in names}
        sizes = {name: transient_bytes(vm_module, name) for name in names}
        needed = [size for size in sizes.values() if size is not None]
        self.workspace_bytes = max(needed) if needed else None
        self._takes_workspace = {name: size is not None for name, size in sizes.items()}
        self._workspace = None
        if self.workspace_bytes is not None:
            self._workspace = device.allocator.allocate_buffer(
                memory_type=int(rt.MemoryType.DEVICE_LOCAL), allowed_usage=int(rt.BufferUsage.DEFAULT),
                allocation_size=max(self.workspace_bytes, 1))

    def __call__(self, name: str, *args: rt.DeviceArray) -> list[rt.DeviceArray]:
        arguments = rt.VmVariantList(len(args) + 1)
        for array in args:
            arguments.push_ref(array._buffer_view)  # DeviceArray has no public accessor for its buffer view
        if self._takes_workspace[name]:
            arguments.push_ref(self._workspace)
        results = rt.VmVariantList(8)
        self._context.vm_context.invoke(self._functions[name], arguments, results)
        return [rt.DeviceArray(self._device, results.get_as_object(i, rt.HalBufferView)) for i in range(results.size)]
