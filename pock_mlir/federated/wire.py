"""What a federated round carries: the tensors a bundle trains, and nothing it keeps frozen.

A trainable parameter travels whole, except a channel-sparse one, which travels as the rows the
compiled step updates (its first `Policy.channels` output channels: the other rows never change
on any device). Buffers the step updates (train-mode BatchNorm statistics) travel too, since they
move on every device. Everything else stays where the bundle put it, on the server and on every
device alike, so the frozen tensors never cross the network.
"""

from __future__ import annotations

import numpy as np

from pock_mlir.runtime.bundle import Bundle


class WireError(ValueError):
    """A set of tensors that is not what this bundle sends (another bundle, or a damaged reply)."""


def wire_shapes(bundle: Bundle) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a round carries, in a fixed order."""
    sig = bundle.signature
    shapes = {name: tuple(sig.trainable_shape(name)) for name in sig.trainable}
    buffers = {b.name: tuple(b.shape) for b in sig.buffers}
    shapes.update({name: buffers[name] for name in sig.updated_buffers})
    return shapes


def to_wire(bundle: Bundle, state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors of `state` (a Trainer.state_dict()) that a round carries: trained rows only."""
    return {
        name: np.ascontiguousarray(state[name][: shape[0]] if shape else state[name])
        for name, shape in wire_shapes(bundle).items()
    }


def check_wire(bundle: Bundle, arrays: dict[str, np.ndarray]) -> None:
    """Refuse tensors that are not exactly what `bundle` sends, naming what differs."""
    shapes = wire_shapes(bundle)
    missing, unknown = sorted(set(shapes) - set(arrays)), sorted(set(arrays) - set(shapes))
    wrong = [
        f"{name} {tuple(arrays[name].shape)} (expected {shapes[name]})"
        for name in shapes
        if name in arrays and tuple(arrays[name].shape) != shapes[name]
    ]
    if missing or unknown or wrong:
        raise WireError(
            "; ".join(
                filter(
                    None,
                    [
                        missing and f"missing {', '.join(missing)}",
                        unknown and f"unexpected {', '.join(unknown)}",
                        wrong and f"wrong shape: {', '.join(wrong)}",
                    ],
                )
            )
        )


def from_wire(bundle: Bundle, state: dict[str, np.ndarray], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The entries of `state` that `arrays` (from to_wire) replace, with their rows written in: a
    subset for Trainer.load_state_dict(..., strict=False)."""
    check_wire(bundle, arrays)
    updated = {}
    for name, array in arrays.items():
        full = np.array(state[name], copy=True)
        if full.ndim:
            full[: len(array)] = array
        else:
            full = np.asarray(array, full.dtype)
        updated[name] = full
    return updated


def _dtypes(bundle: Bundle) -> dict[str, np.dtype]:
    sig = bundle.signature
    return {s.name: np.dtype(s.dtype) for s in sig.params + sig.buffers}


def in_bundle_dtypes(bundle: Bundle, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`arrays` as the bundle stores them: a server optimizer (FedAdam) computes in float64, which
    would double the bytes of every message after the first."""
    dtypes = _dtypes(bundle)
    return {name: np.asarray(array, dtypes[name]) for name, array in arrays.items()}


def wire_bytes(bundle: Bundle) -> int:
    """The bytes of tensor data one message of a round carries (its wire_shapes in the bundle's dtypes)."""
    dtypes = _dtypes(bundle)
    return sum(int(np.prod(shape)) * dtypes[name].itemsize for name, shape in wire_shapes(bundle).items())
