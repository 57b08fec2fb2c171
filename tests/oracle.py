"""PyTorch as the independent oracle: gradients from torch.autograd, trajectories from torch.optim."""

from __future__ import annotations

import contextlib
import copy

import numpy as np
import torch

from pock_mlir.dropout import SeededDropout
from pock_mlir.frontend import resolve_loss


def assert_close_to_norm(actual, expected, rtol: float = 1e-4, what: str = "") -> None:
    """|actual - expected| <= rtol * |expected| in the 2-norm (the brief's gradient criterion)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.linalg.norm(actual - expected)
    scale = max(np.linalg.norm(expected), 1e-12)
    assert err <= rtol * scale, f"{what}: relative error {err / scale:.3e} > {rtol:.0e}"


def _call_parts(inputs) -> tuple[tuple, dict]:
    """(args, kwargs) of model(*args, **kwargs) from a tensor, a tuple, a dict of keyword inputs, or a
    tuple ending in one (the forms compile_training takes)."""
    if isinstance(inputs, dict):
        return (), inputs
    if isinstance(inputs, tuple) and inputs and isinstance(inputs[-1], dict):
        return inputs[:-1], inputs[-1]
    return (inputs if isinstance(inputs, tuple) else (inputs,)), {}


def seeded(seed: int | None):
    """Dropout and stochastic depth drawing the masks a Trainer draws with `seed`
    (pock_mlir/dropout.py); None leaves them to torch's RNG."""
    return contextlib.nullcontext() if seed is None else SeededDropout(torch.tensor(seed, dtype=torch.int32))


def _double(model, inputs, target):
    model = model.double()
    args, kwargs = _call_parts(inputs)
    widen = lambda x: x.double() if x.is_floating_point() else x  # noqa: E731
    inputs = (*map(widen, args), {k: widen(v) for k, v in kwargs.items()})
    return model, inputs, target.double() if target.is_floating_point() else target


def _run(model, inputs):
    args, kwargs = _call_parts(inputs)
    return model(*args, **kwargs)


def torch_gradients(
    model: torch.nn.Module,
    inputs,
    target,
    loss="cross_entropy",
    trainable=None,
    float64: bool = False,
    seed: int | None = None,
):
    """Loss and {name: grad} from torch.autograd on a copy of the model (in double precision
    with float64; with a seed, its masks as a Trainer's gradients() draws them with that seed)."""
    model = copy.deepcopy(model)
    if float64:
        model, inputs, target = _double(model, inputs, target)
    for name, p in model.named_parameters():
        p.requires_grad_(trainable is None or name in trainable)
    with seeded(seed):
        value = resolve_loss(loss)(_run(model, inputs), target)
    value.backward()
    return value.item(), {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}


def torch_trajectory(
    model: torch.nn.Module,
    inputs,
    target,
    optimizer,
    steps: int,
    loss="cross_entropy",
    trainable=None,
    float64: bool = False,
    seed: int | None = None,
):
    """Losses over `steps` torch.optim updates and the final state_dict (parameters, BatchNorm's
    running statistics; a tied weight under each key), on a copy of the model; float64 runs it in
    double precision (see assert_trajectory_close); with a seed, each step draws its masks as a
    Trainer's steps from that seed do (the seed counts steps)."""
    model = copy.deepcopy(model)
    if float64:
        model, inputs, target = _double(model, inputs, target)
    params = [p for n, p in model.named_parameters() if trainable is None or n in trainable]
    for n, p in model.named_parameters():
        p.requires_grad_(trainable is None or n in trainable)
    opt = optimizer.torch_optimizer(params)
    loss_fn = resolve_loss(loss)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        with seeded(None if seed is None else seed + step):
            value = loss_fn(_run(model, inputs), target)
        value.backward()
        opt.step()
        losses.append(value.item())
    return losses, {n: t.detach().numpy().copy() for n, t in model.state_dict().items()}


def torch_sparse_trajectory(
    model: torch.nn.Module, inputs, target, optimizer, steps: int, rows: dict, loss="cross_entropy"
):
    """torch.optim with the parameters outside `rows` frozen (requires_grad=False) and only the
    first rows[name] rows of the others updated: gradient rows beyond them are zeroed by a
    hook, and restored after each step so that weight decay does not move them either (pock's
    semantics: unkept channels never change)."""
    model = copy.deepcopy(model)
    params = dict(model.named_parameters())
    for name, p in params.items():
        p.requires_grad_(name in rows)
    for name, k in rows.items():
        params[name].register_hook(lambda g, k=k: torch.cat([g[:k], torch.zeros_like(g[k:])]))
    opt = optimizer.torch_optimizer([params[name] for name in rows])
    initial = {name: p.detach().clone() for name, p in params.items()}
    loss_fn = resolve_loss(loss)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        value = loss_fn(_run(model, inputs), target)
        value.backward()
        opt.step()
        with torch.no_grad():
            for name, k in rows.items():
                params[name][k:] = initial[name][k:]
        losses.append(value.item())
    return losses, {name: p.detach().numpy().copy() for name, p in params.items()}


FLOAT32_THREADS = (1, 2)  # make test's workers run PyTorch on one thread; users and the bench on two


def torch_float32_trajectories(
    model, inputs, target, optimizer, steps: int, loss="cross_entropy", trainable=None, seed: int | None = None
):
    """torch_trajectory in float32 on each of FLOAT32_THREADS threads."""
    threads = torch.get_num_threads()
    try:
        runs = []
        for count in FLOAT32_THREADS:
            torch.set_num_threads(count)
            runs.append(torch_trajectory(model, inputs, target, optimizer, steps, loss, trainable, seed=seed))
        return runs
    finally:
        torch.set_num_threads(threads)


def assert_gradients_close(
    actual: dict, expected: dict, rtol: float = 1e-4, what: str = "gradient", allowed: dict | None = None
) -> None:
    """Each gradient within rtol of its expected one in the 2-norm. A gradient that is zero up
    to rounding (the bias of a BatchNorm feeding a conv and a train-mode BatchNorm, which cancels
    any per-channel shift) is held to rtol * 1% of the largest gradient's norm, about ten float32
    ulps of it, since its own norm is only noise. `allowed` raises the bound of some names to an
    absolute error."""
    largest = max(np.linalg.norm(np.asarray(v, np.float64)) for v in expected.values())
    for name, want in expected.items():
        want = np.asarray(want, np.float64)
        err = np.linalg.norm(np.asarray(actual[name], np.float64) - want)
        bound = max(rtol * max(np.linalg.norm(want), 1e-2 * largest), (allowed or {}).get(name, 0.0))
        assert err <= bound, f"{what} of {name}: error {err:.3e} > {bound:.3e}"


def assert_gradients_close_to_float64(
    actual: dict,
    model,
    inputs,
    target,
    loss="cross_entropy",
    rtol: float = 1e-4,
    slack: float = 2.0,
    what: str = "gradient",
    trainable=None,
    seed: int | None = None,
) -> None:
    """Gradients against float64 autograd, each within rtol or `slack` times torch float32's own
    distance from float64 (train-mode BatchNorm on a small batch amplifies rounding)."""
    _, want = torch_gradients(model, inputs, target, loss, trainable, float64=True, seed=seed)
    _, f32 = torch_gradients(model, inputs, target, loss, trainable, seed=seed)
    strays = {name: slack * np.linalg.norm(np.asarray(f32[name], np.float64) - want[name]) for name in want}
    assert set(actual) == set(want), f"{what}: names {sorted(set(actual) ^ set(want))} differ"
    assert_gradients_close(actual, want, rtol, what, allowed=strays)


def assert_trajectory_close(
    losses,
    state: dict,
    model,
    inputs,
    target,
    optimizer,
    steps: int,
    rtol: float = 1e-4,
    slack: float = 10.0,
    what: str = "",
    loss="cross_entropy",
    trainable=None,
    seed: int | None = None,
) -> None:
    """Losses and final parameters and buffers of `steps` updates against torch.optim in float64.

    A trajectory can amplify rounding (train-mode BatchNorm on a batch of 4, an activation's kink
    that a value crosses): by step 8 to 10 of the CNN tests torch's own float32 run strays up to
    1e-3 (relative) from float64, and which way depends on the order of float32 sums. So each
    loss and tensor may stray from float64 by rtol, or by `slack` times as far as torch's float32
    run strays there, whichever is larger: pock-mlir is held to PyTorch's own float32 accuracy
    rather than to where a sensitive trajectory lands in exact arithmetic. PyTorch's order of
    sums depends on how many threads split them (the test MobileNetV2's loss at step 10: 4e-7 off
    float64 on one thread, 5.6e-4 on two), so its runs on each of FLOAT32_THREADS count."""
    want_losses, want_state = torch_trajectory(
        model, inputs, target, optimizer, steps, loss, trainable, float64=True, seed=seed
    )
    runs = torch_float32_trajectories(model, inputs, target, optimizer, steps, loss, trainable, seed)
    for step, (got, want) in enumerate(zip(losses, want_losses), 1):
        f32 = max((run_losses[step - 1] for run_losses, _ in runs), key=lambda value: abs(value - want))
        bound = max(rtol * abs(want), slack * abs(f32 - want))
        assert abs(got - want) <= bound, (
            f"{what} loss at step {step}: {got:.8g}, float64 {want:.8g}, "
            f"torch float32 {f32:.8g}; error {abs(got - want):.3e} > {bound:.3e}"
        )
    assert set(state) == set(want_state)
    strays = {
        name: slack
        * max(
            np.linalg.norm(np.asarray(run_state[name], np.float64) - np.asarray(want, np.float64))
            for _, run_state in runs
        )
        for name, want in want_state.items()
    }
    assert_gradients_close(state, want_state, rtol, f"{what} final value", allowed=strays)
