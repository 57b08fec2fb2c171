"""The walking skeleton end to end: an MLP through torch -> pock -> passes -> IREE -> runtime."""

import copy
import gc
import re
import weakref

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from oracle import assert_close_to_norm, torch_gradients, torch_trajectory

import pock_mlir as pock
from pock_mlir.abi import EVALUATE, EVALUATE_TRAIN, GRADIENTS, LOSS, LOSS_TRAIN, TRAIN_STEP_INTO

STEPS = 20


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 5))


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(8, 12, generator=g), torch.randint(0, 5, (8,), generator=g)


OPTIMIZERS = {
    "sgd_momentum": pock.SGD(lr=0.05, momentum=0.9, weight_decay=1e-3),
    "sgd_nesterov": pock.SGD(lr=0.05, momentum=0.9, nesterov=True),
    "sgd_dampening": pock.SGD(lr=0.05, momentum=0.8, dampening=0.3),
    "adamw": pock.AdamW(lr=1e-2, weight_decay=0.05),
}


@pytest.fixture(scope="module", params=list(OPTIMIZERS))
def compiled(request, batch):
    x, y = batch
    model = make_mlp()
    optimizer = OPTIMIZERS[request.param]
    return model, optimizer, pock.compile_training(model, x, y, loss="cross_entropy", optimizer=optimizer)


def test_gradients_match_autograd(compiled, batch):
    model, _, program = compiled
    x, y = batch
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert set(grads) == set(want)
    for name in want:
        assert_close_to_norm(grads[name], want[name], 1e-4, name)


def test_training_matches_torch_optim(compiled, batch):
    model, optimizer, program = compiled
    x, y = batch
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(STEPS)]
    want_losses, want_params = torch_trajectory(model, x, y, optimizer, STEPS)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-4)
    state = trainer.state_dict()
    for name, value in want_params.items():
        assert_close_to_norm(state[name], value, 1e-4, name)
    assert trainer.steps_taken == STEPS
    assert losses[-1] < losses[0]


def test_evaluate_and_state_dict_round_trip(compiled, batch):
    model, _, program = compiled
    x, _ = batch
    trainer = program.trainer()
    np.testing.assert_allclose(trainer.evaluate(x), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    zeros = {n: np.zeros_like(v) for n, v in trainer.state_dict().items()}
    trainer.load_state_dict(zeros)
    np.testing.assert_array_equal(trainer.evaluate(x), np.zeros((8, 5), np.float32))


def test_steps_read_each_batch_and_go_on_from_loaded_state(compiled, batch):
    """A step reads the batch it is given, and after load_state_dict and load_optimizer_state
    mid-run the steps go on from what was loaded (a step reuses its argument lists: Trainer.step)."""
    model, optimizer, program = compiled
    x, y = batch
    batches = [(x, y), (x.flip(0) * 0.5, y.flip(0))]
    trainer = program.trainer()
    for i in range(3):  # an odd count: the step counter that a step passes has alternated
        trainer.step(*batches[i % 2])
    trainer.load_state_dict(model.state_dict())
    trainer.load_optimizer_state(program.trainer().optimizer_state())
    losses = [trainer.step(*batches[i % 2]) for i in range(6)]
    reference = copy.deepcopy(model)
    torch_optimizer = optimizer.torch_optimizer(list(reference.parameters()))
    want = []
    for i in range(6):
        torch_optimizer.zero_grad()
        loss = F.cross_entropy(reference(batches[i % 2][0]), batches[i % 2][1])
        loss.backward()
        torch_optimizer.step()
        want.append(loss.item())
    np.testing.assert_allclose(losses, want, rtol=1e-4)


def test_mse_loss_and_numpy_inputs():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = (
        np.random.RandomState(0).randn(6, 4).astype(np.float32),
        np.random.RandomState(1).randn(6, 2).astype(np.float32),
    )
    program = pock.compile_training(model, x, y, loss="mse", optimizer=pock.SGD(lr=0.1))
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, torch.from_numpy(x), torch.from_numpy(y), loss="mse")
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for name in want:
        assert_close_to_norm(grads[name], want[name], 1e-4, name)


def function_text(module: str, name: str) -> str:
    start = module.index(f"func.func @{name}(")
    end = module.find("\n  func.func ", start)
    return module[start : end if end >= 0 else None]


def test_evaluate_is_the_step_forward_without_the_loss(compiled):
    """One export serves both: evaluate calls forward_loss on a zero target, and by the lowered
    stage nothing of the loss (nor the zero target) is left in it."""
    _, _, program = compiled
    assert "call @forward_loss" in function_text(program.ir("imported"), EVALUATE)
    evaluate = function_text(program.ir("lowered"), EVALUATE)
    assert re.search(r"torch\.aten\.(linear|mm|addmm|matmul)\b", evaluate), evaluate  # the model's forward
    assert not re.findall(r"torch\.aten\.(_log_softmax|nll_loss\w*|full)\b", evaluate), evaluate


def test_ir_stages_are_inspectable(compiled):
    _, _, program = compiled
    assert "func.func @forward_loss" in program.ir("imported")
    assert '"pock.grad"' in program.ir("training")
    assert '"pock.grad"' not in program.ir("autodiff")
    # no pock op is left; the module keeps pock-backend-switch's per-program choices
    assert set(re.findall(r"pock\.\w+", program.ir("lowered"))) == {
        "pock.data_tiling",
        "pock.data_tiling_reason",
        "pock.vector_tails",
        "pock.vector_tails_reason",
        "pock.fusion",
        "pock.fusion_reason",
        "pock.driver",
        "pock.driver_reason",
    }
    with pytest.raises(KeyError, match="stages are"):
        program.ir("nonsense")


def test_wrong_batch_shape_is_a_clear_error(compiled, batch):
    _, _, program = compiled
    x, y = batch
    with pytest.raises(ValueError, match=r"input0: expected shape \(8, 12\)"):
        program.trainer().step(x[:4], y[:4])


def test_a_trainer_compiles_what_it_calls(batch):
    """compile_training compiles the step's module (with loss and evaluate); gradients' module (with
    the train-mode loss and evaluate) compiles the first time it is called, and the workspace grows
    to the largest function of the two; a program compiled for gradients alone compiles the step's
    module on the first step, and one compiled for both holds them in one module. A trainer keeps what compiling needs, not the
    program: dropping it frees the program's copy of the initial values."""
    from pock_mlir.runtime.workspace import module_transient_bytes

    x, y = batch
    model = make_mlp()
    program = pock.compile_training(model, x, y, optimizer=OPTIMIZERS["adamw"])
    step_module, gradients_module = (TRAIN_STEP_INTO, LOSS, EVALUATE), (GRADIENTS, LOSS_TRAIN, EVALUATE_TRAIN)
    assert list(program.modules) == [step_module]
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(2)]
    loss, grads = trainer.gradients(x, y)
    assert list(program.modules) == [step_module, gradients_module]
    workspace = max(module_transient_bytes(m.vmfb, f) for m in program.modules.values() for f in m.functions)
    assert trainer.workspace_bytes == workspace
    want_losses, state = torch_trajectory(make_mlp(), x, y, OPTIMIZERS["adamw"], 3)
    np.testing.assert_allclose(losses + [loss], want_losses, rtol=1e-5)

    only = pock.compile_training(make_mlp(), x, y, optimizer=OPTIMIZERS["adamw"], functions=("gradients",))
    assert list(only.modules) == [gradients_module]
    initial, modules = weakref.ref(only.initial_params["0.weight"]), only.modules
    trainer = only.trainer()
    del only  # the trainer does not keep the program's host copy of the initial values
    gc.collect()
    assert initial() is None
    assert trainer.gradients(x, y)[0] == pytest.approx(want_losses[0], rel=1e-5)
    assert trainer.step(x, y) == pytest.approx(want_losses[0], rel=1e-5) and list(modules)[1] == step_module

    both = pock.compile_training(make_mlp(), x, y, optimizer=OPTIMIZERS["adamw"], functions=("step", "gradients"))
    assert list(both.modules) == [
        (TRAIN_STEP_INTO, GRADIENTS, LOSS, EVALUATE, LOSS_TRAIN, EVALUATE_TRAIN)
    ]  # one module
    trainer = both.trainer()
    assert trainer.gradients(x, y)[0] == pytest.approx(want_losses[0], rel=1e-5)
    assert trainer.step(x, y) == pytest.approx(want_losses[0], rel=1e-5) and len(both.modules) == 1
    with pytest.raises(ValueError, match="functions: give the Trainer methods to compile now, of step, gradients"):
        pock.compile_training(make_mlp(), x, y, functions=("train",))
