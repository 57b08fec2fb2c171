"""The sparse-scheme search (pock_mlir/search.py, pock-search): it finds the one layer a planted
task needs, its cost model agrees with the compiler's, its host-side fine-tuning with PyTorch, its
scheme round-trips through compile_training within the memory budget, and bad input is refused."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
import yaml
from docs_blocks import doc_commands
from oracle import torch_trajectory
from pock_mlir.passes.pock_apply_sparse_config import reannotate
from safetensors.torch import save_file

import pock_mlir as pock
from pock_mlir.abi import EVALUATE, LOSS, TRAIN_STEP, TRAIN_STEP_INTO, Policy
from pock_mlir.context import make_context
from pock_mlir.data import Split, evaluate
from pock_mlir.report import report
from pock_mlir.runtime import Trainer
from pock_mlir.search import (
    MAX_SCHEDULES,
    MB,
    YAML_HEADER,
    CostModel,
    Measurement,
    Progress,
    SearchError,
    Unit,
    candidate_units,
    fit_to_budget,
    host_fine_tune,
    int8_savings,
    last_layer,
    measure_contributions,
    select,
)
from pock_mlir.tools import pock_search

REPO = Path(__file__).resolve().parents[1]
BATCH = 32
FEATURES, CLASSES = 128, 32


class Planted(nn.Module):
    """Two linear experts summed into the logits, each reading its own half of the input; the
    labels depend on one half only, so only that expert's weight can learn the task."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Linear(FEATURES, CLASSES)
        self.b = nn.Linear(FEATURES, CLASSES)
        for layer in (self.a, self.b):
            nn.init.normal_(layer.weight, std=0.01)

    def forward(self, x):
        return self.a(x[:, :FEATURES]) + self.b(x[:, FEATURES:])


def planted_data(informative: str, samples: int, seed: int):
    """x: both halves standard normal; y: a fixed linear teacher's class on the `informative` half."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((samples, 2 * FEATURES)).astype(np.float32)
    teacher = np.random.default_rng(99).standard_normal((FEATURES, CLASSES))
    half = x[:, :FEATURES] if informative == "a" else x[:, FEATURES:]
    return x, np.argmax(half @ teacher, axis=1).astype(np.int64)


def search(informative: str, budget, anchor=None, **options):
    """Candidates judged alone by default: the planted task is about which expert, not the head."""
    return pock.search_sparse(
        Planted(),
        planted_data(informative, 512, 1),
        planted_data(informative, 128, 2),
        budget=budget,
        optimizer=pock.SGD(lr=0.5),
        steps=8,
        batch_size=BATCH,
        anchor=anchor,
        **options,
    )


@pytest.fixture(scope="module", params=["a", "b"])
def planted(request):
    """(the informative expert, its search under a budget every scheme fits)."""
    return request.param, search(request.param, pock.Budget(memory_mb=64))


def test_search_finds_the_planted_layer(planted):
    informative, result = planted
    other = "b" if informative == "a" else "a"
    gains = {str(m.unit): m.gain for m in result.measurements}
    best = max(result.measurements, key=lambda m: m.gain)
    assert best.unit == Unit(f"{informative}.weight"), result.table()
    # The other expert sees only noise: it gains next to nothing.
    assert gains[f"{other}.weight"] < 0.05 * gains[f"{informative}.weight"], result.table()
    assert {str(c.unit) for c in result.choices} >= {f"{informative}.weight"}
    assert result.measured_gain > 0.5 * gains[f"{informative}.weight"], result.table()


def test_a_tight_budget_keeps_the_planted_layer_only(planted):
    """A budget of what training the planted weight alone measures on the device: the search keeps
    it (perhaps at a ratio) and leaves the other expert out, within the budget. Searched together
    with the generous budget, which then chooses what it chose searched alone."""
    informative, generous = planted
    x, y = planted_data(informative, BATCH, 1)
    alone = pock.compile_training(Planted(), x, y, optimizer=pock.SGD(lr=0.5), sparse={f"{informative}.weight": "full"})
    budget = pock.Budget(memory_mb=alone.trainer().device_bytes / MB)
    result, again = search(informative, [budget, generous.budget])
    trained = {c.unit.parameter for c in result.choices}
    assert f"{informative}.weight" in trained and not trained & {"a.weight", "b.weight"} - {f"{informative}.weight"}
    assert result.chosen.device_bytes <= budget.memory_bytes, result.table()
    # Deterministic for a seed: the same candidates measure the same gains, whatever the budget.
    assert [(m.unit, m.gain) for m in result.measurements] == [(m.unit, m.gain) for m in generous.measurements]
    assert again.choices == generous.choices and again.chosen.device_bytes == generous.chosen.device_bytes
    assert result.measurements is again.measurements and result.full == again.full


def test_an_anchored_search_keeps_the_anchor_and_adds_what_gains_beyond_it():
    """Anchored on the last layer (expert b, uninformative): every scheme trains b, and the
    informative expert a is what gains beyond it."""
    result = search("a", pock.Budget(memory_mb=64), anchor="auto")
    assert result.anchor == [Unit("b.weight"), Unit("b.bias")]
    assert [c.unit for c in result.choices[:2]] == result.anchor
    assert Unit("a.weight") in {c.unit for c in result.choices}
    assert max(result.measurements, key=lambda m: m.gain).unit == Unit("a.weight"), result.table()
    assert {m.unit.parameter for m in result.measurements} == {"a.weight", "a.bias"}
    assert result.predicted_gain == pytest.approx(
        result.full.val_loss - result.anchored_loss + sum(c.gain for c in result.choices)
    )
    text = result.to_yaml()
    assert '"b.weight": full  # the anchor: validation loss' in text
    assert '"a.weight": full  # validation loss -' in text and "trained with the anchor (b.weight, b.bias)" in text


def test_the_scheme_round_trips_through_compile_training_within_the_budget(planted, tmp_path):
    informative, result = planted
    path = result.write(tmp_path / "scheme.yaml")
    text = path.read_text()
    assert text.startswith(YAML_HEADER)
    assert yaml.safe_load(text) == {"default": "frozen", **{c.unit.parameter: c.unit.policy for c in result.choices}}
    x, y = planted_data(informative, BATCH, 1)
    program = pock.compile_training(Planted(), x, y, optimizer=pock.SGD(lr=0.5), sparse=str(path))
    want = {name: Policy("frozen") for name, _ in Planted().named_parameters()}
    want.update(
        {
            c.unit.parameter: Policy("full") if c.unit.ratio == 1 else Policy("channels", c.unit.ratio)
            for c in result.choices
        }
    )
    assert program.signature.policies == want
    trainer = program.trainer()
    assert trainer.device_bytes == result.chosen.device_bytes <= result.budget.memory_bytes


def test_a_scheduled_scheme_holds_what_its_trainer_holds(planted):
    """The search measures a chosen scheme from IREE's schedule alone (TrainingProgram.device_bytes):
    the workspace and in-place roles read from the stream phase are the compiled module's, so the
    bytes are its Trainer's, and the compilation then resumes from that schedule."""
    informative, result = planted
    x, y = planted_data(informative, BATCH, 1)
    program = pock.compile_training(
        Planted(), x, y, optimizer=pock.SGD(lr=0.5), sparse=result.sparse, functions=(), cache=False
    )
    step_module = (TRAIN_STEP_INTO, LOSS, EVALUATE)
    scheduled, planned = program.schedule(step_module), program.device_bytes
    assert not program.modules and set(program.streams) == {step_module}
    assert scheduled.workspace_bytes > 0
    trainer = program.trainer()
    assert trainer.device_bytes == planned == result.chosen.device_bytes
    assert not program.streams and program.schedule(step_module) == scheduled  # now from the module's reflection
    assert trainer.workspace_bytes == scheduled.workspace_bytes and trainer.in_place == scheduled.in_place


# -- the cost model against the compiler -----------------------------------------------------


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 5))


def mlp_batch(samples=BATCH, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(samples, 12, generator=g), torch.randint(0, 5, (samples,), generator=g)


@pytest.fixture(scope="module")
def mlp_program():
    x, y = mlp_batch()
    return pock.compile_training(make_mlp(), x, y, optimizer=pock.SGD(lr=0.1, momentum=0.9))


def compiler_cost(training_text: str, scheme: dict):
    """The sparse-BP report of the full-BP training IR re-annotated by pock-apply-sparse-config."""
    from torch_mlir import ir

    with make_context(), ir.Location.unknown():
        module = ir.Module.parse(training_text)
        reannotate(module.operation, scheme)
        text = str(module)
    return report(text, TRAIN_STEP).sparse


@pytest.mark.parametrize(
    "scheme",
    [
        {"4.weight": "full"},
        {"0.bias": "full"},
        {"2.weight": "full", "4.bias": "full"},
        {"0.weight": "full", "2.weight": "full", "4.weight": "full"},
        {"2.weight": 0.5, "4.weight": "full"},
        {"0.weight": 0.25},
    ],
)
def test_cost_of_a_scheme_is_the_compilers(mlp_program, scheme):
    costs = CostModel(mlp_program)
    estimate = costs.estimate([Unit(name, 1.0 if policy == "full" else policy) for name, policy in scheme.items()])
    want = compiler_cost(mlp_program.ir("training"), {"default": "frozen", **scheme})
    got = estimate.backward
    assert (got.saved_activation_bytes, got.gradient_bytes) == (want.saved_activation_bytes, want.gradient_bytes)
    if all(policy == "full" for policy in scheme.values()):
        assert got == want
    else:  # the cost model narrows only a gradient's own ops, pock-sparse-bp also the chain of ops that leads there
        whole = costs.estimate([Unit(name) for name in scheme]).backward
        assert want.flops <= got.flops < whole.flops, (got, want, whole)


def test_int8_estimate_saves_what_the_compiled_int8_parameters_save(mlp_program):
    """The estimate over an int8 base is lower by the parameter bytes the compiled int8 program
    stores less than the float32 one, for the same scheme."""
    scheme = {"4.weight": "full", "4.bias": "full"}
    x, y = mlp_batch()
    int8 = pock.compile_training(
        make_mlp(),
        x,
        y,
        optimizer=pock.SGD(lr=0.1, momentum=0.9),
        sparse={"default": "frozen", **scheme, "quantize": {"frozen": "int8"}},
    )
    stored = {p.name: np.dtype(p.dtype).itemsize * int(np.prod(p.shape)) for p in int8.signature.params}
    assert {"0.weight_int8", "2.weight_int8"} <= set(stored) and "4.weight_int8" not in stored
    as_float32 = sum(np.dtype(p.dtype).itemsize * int(np.prod(p.shape)) for p in mlp_program.signature.params)
    units = [Unit(name) for name in scheme]
    float32_estimate = CostModel(mlp_program).estimate(units).device_bytes
    int8_estimate = CostModel(mlp_program, int8_savings(make_mlp(), "int8")).estimate(units).device_bytes
    assert float32_estimate - int8_estimate == as_float32 - sum(stored.values()) > 0


def test_memory_estimate_of_full_bp_is_the_trainers(mlp_program):
    costs = CostModel(mlp_program)
    trainer = mlp_program.trainer()
    units = [Unit(name) for name in costs.names]
    assert trainer.in_place >= {"params", "optimizer"}  # so the estimate counts one set of each
    assert costs.estimate(units).device_bytes == trainer.device_bytes
    assert costs.estimate(units).time_fraction == 1.0


def test_candidates():
    units = candidate_units({"w": (8, 3), "b": (8,), "s": (), "narrow": (3, 4), "row": (1, 5)})
    assert [str(u) for u in units] == [
        "w @0.125",
        "w @0.25",
        "w @0.5",
        "w",
        "b",
        "s",
        "narrow @0.125",
        "narrow @0.5",
        "narrow",
        "row",
    ]


# -- the host-side fine-tuning of the contribution analysis ---------------------------------------


@pytest.mark.parametrize(
    "optimizer", [pock.SGD(lr=0.1, momentum=0.9, weight_decay=0.01), pock.AdamW(lr=0.01)], ids=["sgd", "adamw"]
)
def test_host_fine_tune_of_a_tensor_matches_torch_optim(mlp_program, optimizer):
    x, y = mlp_batch()
    trainer = mlp_program.trainer()
    units = [Unit("2.weight"), Unit("4.bias")]
    got = host_fine_tune(trainer, units, Split([x.numpy()], y.numpy()), [np.arange(BATCH)] * 4, optimizer)
    _, want = torch_trajectory(make_mlp(), x, y, optimizer, 4, trainable={"2.weight", "4.bias"})
    for name in ("2.weight", "4.bias"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6)
    state = trainer.state_dict()
    np.testing.assert_array_equal(state["0.weight"], make_mlp().state_dict()["0.weight"].numpy())


def test_contributions_with_the_anchor_are_torch_optim_fine_tuning_both(mlp_program):
    """The base loss is the anchor fine-tuned alone, each candidate's is the candidate fine-tuned
    with the anchor, both by torch.optim on the same batches; the trainer ends as it started."""
    optimizer = pock.SGD(lr=0.1, momentum=0.9)
    x, y = mlp_batch()
    xv, yv = mlp_batch(seed=2)
    train, val = Split([x.numpy()], y.numpy()), Split([xv.numpy()], yv.numpy())
    anchor = last_layer([name for name, _ in make_mlp().named_parameters()])
    assert anchor == [Unit("4.weight"), Unit("4.bias")]
    trainer = mlp_program.trainer()
    candidates = [Measurement(u, math.nan, math.nan, None) for u in (Unit("0.bias"), Unit("2.weight"))]
    base, measured = measure_contributions(
        trainer, candidates, train, val, optimizer, [np.arange(BATCH)] * 3, BATCH, Progress(False), anchor
    )

    def torch_val_loss(trainable):
        _, state = torch_trajectory(make_mlp(), x, y, optimizer, 3, trainable=trainable)
        model = make_mlp()
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(model(xv), yv).item()

    want_base = torch_val_loss({"4.weight", "4.bias"})
    assert base == pytest.approx(want_base, rel=1e-5)
    for m in measured:
        want = torch_val_loss({"4.weight", "4.bias", m.unit.parameter})
        assert m.val_loss == pytest.approx(want, rel=1e-5) and m.gain == pytest.approx(want_base - want, abs=1e-6)
    np.testing.assert_array_equal(trainer.state_dict()["4.weight"], make_mlp().state_dict()["4.weight"].numpy())
    assert evaluate(trainer, val, BATCH)["val_loss"] == pytest.approx(
        torch.nn.functional.cross_entropy(make_mlp()(xv), yv).item(), rel=1e-5
    )


def test_host_fine_tune_of_channels_matches_the_compiled_channel_sparse_step(mlp_program):
    """Against pock-mlir's own channel-sparse program, whose rows tests/test_sparse.py holds to PyTorch."""
    optimizer = pock.AdamW(lr=0.01)
    batches = [mlp_batch(seed=s) for s in range(3)]
    split = Split([torch.cat([b[0] for b in batches]).numpy()], torch.cat([b[1] for b in batches]).numpy())
    order = [np.arange(i * BATCH, (i + 1) * BATCH) for i in range(3)]
    got = host_fine_tune(mlp_program.trainer(), [Unit("2.weight", 0.25)], split, order, optimizer)["2.weight"]
    sparse = pock.compile_training(make_mlp(), *batches[0], optimizer=optimizer, sparse={"2.weight": 0.25}).trainer()
    for inputs, target in batches:
        sparse.step(inputs, target)
    want = sparse.state_dict()["2.weight"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[4:], make_mlp().state_dict()["2.weight"].numpy()[4:])


# -- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "Budget needs memory_mb, step_time or both"),
        ({"memory_mb": 0}, "memory_mb must be > 0"),
        ({"step_time": 1.5}, "in (0, 1]"),
    ],
)
def test_bad_budgets(options, message):
    with pytest.raises(SearchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pock.Budget(**options)


def test_a_budget_below_the_parameters_is_refused_before_compiling():
    resident = 4 * 2 * (FEATURES * CLASSES + CLASSES)  # two experts' weights and biases, float32
    with pytest.raises(
        SearchError, match=rf"below the model's parameters and buffers alone \({resident / MB:.3f} MB\)"
    ):
        search("a", pock.Budget(memory_mb=0.001))


def test_an_int8_base_is_counted_as_stored_before_compiling():
    """Each expert's weight as int8 (one byte a value) and a float32 scale per output channel."""
    resident = 2 * (4 * CLASSES + FEATURES * CLASSES + 4 * CLASSES)
    with pytest.raises(SearchError, match=rf"alone \({resident / MB:.3f} MB, the layer weights int8\)"):
        search("a", pock.Budget(memory_mb=0.005), quantize="int8")
    with pytest.raises(SearchError, match=r"quantize must be None or one of 'int8', 'int4'.*got 'int2'"):
        search("a", pock.Budget(memory_mb=1), quantize="int2")


def test_an_int8_search_keeps_its_base_in_the_scheme_within_the_budget(tmp_path):
    """Over an int8 base: the frozen expert is stored as int8 in the compiled scheme, which the YAML
    carries, and the program measures within the budget."""
    result = search("a", pock.Budget(memory_mb=64), quantize="int8")
    path = result.write(tmp_path / "scheme.yaml")
    assert yaml.safe_load(path.read_text())["quantize"] == {"frozen": "int8"}
    x, y = planted_data("a", BATCH, 1)
    program = pock.compile_training(Planted(), x, y, optimizer=pock.SGD(lr=0.5), sparse=str(path))
    trained = {c.unit.parameter for c in result.choices}
    stored = {p.name for p in program.signature.params}
    for layer in ("a", "b"):
        assert (f"{layer}.weight_int8" in stored) == (f"{layer}.weight" not in trained), (stored, trained)
    assert program.trainer().device_bytes == result.chosen.device_bytes <= result.budget.memory_bytes


def test_a_budget_nothing_meets_names_the_cheapest_scheme(planted):
    _, result = planted
    # the least memory, of equal memories the shortest step
    cheapest = min(result.measurements, key=lambda m: (m.cost.device_bytes, m.cost.time_fraction))
    budget = pock.Budget(memory_mb=(cheapest.cost.device_bytes - 1) / MB)
    with pytest.raises(SearchError) as raised:
        search("a", budget)
    message = str(raised.value)
    assert (
        f"the cheapest scheme, training {cheapest.unit} alone, needs {cheapest.cost.device_bytes / MB:.3f} MB"
        in message
    )
    with pytest.raises(
        SearchError,
        match=r"the cheapest scheme, training the anchor \(b.weight, b.bias\) alone, needs "
        r".* give a larger budget, or anchor=None",
    ):
        search("a", budget, anchor="auto")
    with pytest.raises(SearchError, match=r"anchor: 'c.weight' is not a parameter of the model"):
        search("a", budget, anchor=["c.weight"])


# -- pock-search ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def planted_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("search")
    (root / "planted.py").write_text(
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import torch\nfrom test_search import BATCH, Planted, planted_data\n\n"
        "def model():\n    return Planted()\n\n"
        "def example_batch():\n    x, y = planted_data('b', BATCH, 1)\n    return torch.from_numpy(x), torch.from_numpy(y)\n"
    )
    # the same model built on the meta device, its weights in a file, as pock-compile takes WEIGHTS
    header = (root / "planted.py").read_text().split("def model()")[0]
    (root / "planted_meta.py").write_text(
        header + 'WEIGHTS = "planted.safetensors"\n\n'
        "def model():\n    with torch.device('meta'):\n        return Planted()\n\n"
        "def example_batch():\n    x, y = planted_data('b', BATCH, 1)\n    return torch.from_numpy(x), torch.from_numpy(y)\n"
    )
    save_file(Planted().state_dict(), root / "planted.safetensors")
    (x, y), (xv, yv) = planted_data("b", 512, 1), planted_data("b", 128, 2)
    np.savez(root / "data.npz", x_train=x, y_train=y, x_val=xv, y_val=yv)
    return root


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--memory-budget", "40XB"], "--memory-budget '40XB': give a size such as 40MB"),
        (["--time-budget", "2"], "step_time is a fraction of the full-BP step, in (0, 1]"),
        ([], "give --memory-budget, --time-budget or both"),
        (["--memory-budget", "8MB", "--optimizer", "sgd:lr=-1"], "SGD lr must be > 0"),
        (["--memory-budget", "8MB", "--steps", "0"], "steps must be an integer >= 1"),
        (
            ["--memory-budget", "0.005MB", "--quantize", "int8"],
            "alone (0.008 MB, the layer weights int8): no scheme fits",
        ),
    ],
)
def test_pock_search_refuses_bad_arguments(planted_files, capsys, arguments, message):
    root = planted_files
    output = root / "bad.yaml"
    assert (
        pock_search.main([str(root / "planted.py"), "--data", str(root / "data.npz"), *arguments, "-o", str(output)])
        == 1
    )
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not output.exists()


def test_pock_search_refuses_data_without_a_held_out_split_and_files_it_did_not_write(planted_files, tmp_path, capsys):
    root = planted_files
    x, y = planted_data("b", 64, 1)
    np.savez(tmp_path / "train_only.npz", x_train=x, y_train=y)
    arguments = [str(root / "planted.py"), "--memory-budget", "8MB"]
    assert (
        pock_search.main([*arguments, "--data", str(tmp_path / "train_only.npz"), "-o", str(tmp_path / "s.yaml")]) == 1
    )
    assert "has no held-out split" in capsys.readouterr().err
    np.savez(tmp_path / "narrow.npz", x_train=x[:, :10], y_train=y, x_val=x[:, :10], y_val=y)
    assert pock_search.main([*arguments, "--data", str(tmp_path / "narrow.npz"), "-o", str(tmp_path / "s.yaml")]) == 1
    assert f"x_train has samples of shape (10,), the bundle takes ({2 * FEATURES},)" in capsys.readouterr().err
    (tmp_path / "notes.yaml").write_text("keep: me\n")
    assert pock_search.main([*arguments, "--data", str(root / "data.npz"), "-o", str(tmp_path / "notes.yaml")]) == 1
    assert "exists and is not a scheme pock-search wrote" in capsys.readouterr().err
    assert (tmp_path / "notes.yaml").read_text() == "keep: me\n"


def test_pock_search_starts_a_meta_model_from_the_model_files_weights(planted_files, capsys):
    """A model file whose model() builds on the meta device with WEIGHTS beside it: the search trains
    from the file's weights, its full-BP validation loss PyTorch's of the model holding them."""
    root = planted_files
    argv = [str(root / "planted_meta.py"), "--data", str(root / "data.npz"), "--memory-budget", "64MB"]
    assert pock_search.main([*argv, "--steps", "2", "-o", str(root / "meta.yaml")]) == 0
    full_bp = float(re.search(r"validation loss (\d+\.\d+) -> ", capsys.readouterr().out).group(1))
    x, y = planted_data("b", 128, 2)
    with torch.no_grad():
        want = nn.functional.cross_entropy(Planted()(torch.from_numpy(x)), torch.from_numpy(y)).item()
    assert full_bp == pytest.approx(want, abs=2e-5)
    assert (root / "meta.yaml").read_text().startswith(YAML_HEADER)


def test_pock_search_runs_as_a_module(planted_files):
    root = planted_files
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pock_mlir.tools.pock_search",
            str(root / "planted.py"),
            "--data",
            str(root / "data.npz"),
            "--memory-budget",
            "0.001MB",
            "-o",
            str(root / "m.yaml"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
    )
    assert done.returncode == 1 and done.stderr.startswith("pock-search: error: the memory budget 0.001 MB is below")
    assert "Traceback" not in done.stderr and not (root / "m.yaml").exists()


def test_readme_block(tmp_path):
    """docs/sparse-updates.md's pock-search commands as written, in a scratch repository root; the
    compiled bundle of the scheme holds no more device memory than the budget."""
    from test_readme_commands import VENV_BIN, user_directory

    commands = doc_commands("docs/sparse-updates.md", "## Searching a sparse scheme")
    assert [c.split()[0] for c in commands] == ["python", "pock-search", "pock-compile"]
    cwd = user_directory(tmp_path)
    env = dict(os.environ, PATH=os.pathsep.join([str(VENV_BIN), os.environ["PATH"]]), PYTHONPATH=str(REPO))
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{command}\n{done.stderr[-2000:]}"
        if command.startswith("pock-search"):  # progress on stderr, the table on stdout
            assert "10/10 candidates measured, best so far" in done.stderr and "s left" in done.stderr, done.stderr
            assert "device memory estimated" in done.stdout and "wrote scheme.yaml" in done.stdout, done.stdout
    assert (cwd / "scheme.yaml").read_text().startswith(YAML_HEADER)
    trainer = Trainer.from_bundle(cwd / "digits_searched")
    assert trainer.device_bytes <= 300 * 1024
    assert set(trainer.signature.trainable) == set(yaml.safe_load((cwd / "scheme.yaml").read_text())) - {"default"}


class Device:
    """A stand-in for compiling a scheme: it measures the cost model's estimate of what a scheme adds
    to training nothing, times `scale`; what the head's tensors ("4.") add, times `head_scale`."""

    def __init__(self, costs, scale, head_scale=None):
        self.costs, self.scale, self.schemes = costs, scale, []
        self.head_scale = scale if head_scale is None else head_scale

    @property
    def compiled(self):
        return len(self.schemes)

    def __call__(self, choices):
        units = [c.unit for c in choices]
        self.schemes.append(frozenset(units))
        nothing = self.costs.estimate([]).device_bytes
        head = self.costs.estimate([u for u in units if u.parameter.startswith("4.")]).device_bytes
        added = self.costs.estimate(units).device_bytes - head
        return SimpleNamespace(device_bytes=nothing + round(self.head_scale * (head - nothing) + self.scale * added))


def ranked_candidates(program):
    """(its CostModel, every candidate unit measured with a gain that grows in parameter order)."""
    costs = CostModel(program)
    units = candidate_units({name: costs.specs[name].shape for name in costs.names})
    return costs, [Measurement(u, 0.0, 1.0 + i, costs.estimate([u])) for i, u in enumerate(units)]


@pytest.mark.parametrize("scale", [0.8, 1.25, 2.5])
def test_measured_memory_calibrates_the_selection(mlp_program, scale):
    """A device that measures less than the estimate lets the selection use the slack; one that
    measures more, up to what a scheme adds 2.5 times the estimate, makes it select again below the
    budget; either way what it keeps measured within."""
    costs, measured = ranked_candidates(mlp_program)
    budget = pock.Budget(memory_mb=costs.estimate([Unit("4.weight"), Unit("2.weight")]).device_bytes / MB)
    first = select(measured, costs, budget.memory_bytes, math.inf)
    device, attempts = Device(costs, scale), []
    choices, trainer = fit_to_budget(measured, costs, budget, device, attempts, Progress(False))
    assert device.compiled == len(attempts) >= 2 and trainer.device_bytes <= budget.memory_bytes
    assert trainer.device_bytes in attempts
    used = costs.estimate([c.unit for c in choices]).device_bytes
    assert used > costs.estimate([c.unit for c in first]).device_bytes if scale < 1 else used < budget.memory_bytes


def fill_the_room(mlp_program, scale):
    """fit_to_budget at a budget the first selection fills by the estimate, little above what training
    nothing costs, on a Device measuring what a scheme adds `scale` times the estimate: (the first
    selection, what it kept, the measurements, the budget)."""
    costs, measured = ranked_candidates(mlp_program)
    budget = pock.Budget(memory_mb=costs.estimate([Unit("4.weight"), Unit("4.bias"), Unit("2.bias")]).device_bytes / MB)
    first = select(measured, costs, budget.memory_bytes, math.inf)
    assert costs.estimate([c.unit for c in first]).device_bytes == budget.memory_bytes
    attempts = []
    choices, trainer = fit_to_budget(measured, costs, budget, Device(costs, scale), attempts, Progress(False))
    assert budget.memory_bytes >= trainer.device_bytes and trainer.device_bytes in attempts
    return first, choices, attempts, budget


def test_a_first_scheme_far_above_the_budget_gives_way_to_one_within_it(mlp_program):
    """The first scheme measures what it adds 2.5 times the estimate: the next selection keeps within
    the budget, where lowering it by the whole error left room for nothing."""
    first, choices, attempts, budget = fill_the_room(mlp_program, 2.5)
    assert attempts[0] > budget.memory_bytes and choices and len(choices) < len(first)


def test_a_first_scheme_that_leaves_most_of_the_room_gives_way_to_a_larger_one(mlp_program):
    """The first scheme measures what it adds at a twentieth of the estimate (the vision task's scheme
    at the last two blocks' memory: 0.01 of an estimated 0.18 MB), 3.8% of the budget unused but 95%
    of the room over training nothing: the next selection uses the room, within the budget."""
    first, choices, attempts, budget = fill_the_room(mlp_program, 0.05)
    assert len(attempts) >= 2 and sum(c.gain for c in choices) > sum(c.gain for c in first)


def test_a_retry_far_above_the_budget_brackets_a_scheme_within_it(mlp_program):
    """The head measures what it adds at a twentieth of the estimate, the rest at 1.5 times it (the
    vision task at its last two blocks' memory): the head alone leaves most of the room, the retry
    for that room trains every layer, far above the budget; between the two measured schemes the
    selection finds one within the budget that gains more than the head alone, where calibrating on
    the retry's error alone led back to the head."""
    costs, measured = ranked_candidates(mlp_program)
    budget = pock.Budget(memory_mb=costs.estimate([Unit("4.weight"), Unit("4.bias")]).device_bytes / MB)
    first = select(measured, costs, budget.memory_bytes, math.inf)
    assert {c.unit.parameter for c in first} == {"4.weight", "4.bias"}
    device, attempts = Device(costs, 1.5, head_scale=0.05), []
    choices, trainer = fit_to_budget(measured, costs, budget, device, attempts, Progress(False))
    assert attempts[0] < budget.memory_bytes < attempts[1] and len(attempts) <= MAX_SCHEDULES
    assert len(set(device.schemes)) == device.compiled  # a selection repeated in the bracket is not compiled again
    assert budget.memory_bytes >= trainer.device_bytes and trainer.device_bytes in attempts
    assert sum(c.gain for c in choices) > sum(c.gain for c in first)
