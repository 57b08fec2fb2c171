"""pock-compile and pock-train end to end on examples/mlp_digits.py, and their answers to bad input;
pock-opt's start-up without PyTorch."""

import importlib.util
import inspect
import json
import os
import pty
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from pock_mlir.abi import EVALUATE, EVALUATE_TRAIN, GRADIENTS, LOSS, LOSS_TRAIN, TRAIN_STEP
from pock_mlir.frontend import resolve_loss
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.workspace import BatchSlots, LossSlot
from pock_mlir.tools import pock_compile, pock_train

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
EXAMPLE = REPO / "examples" / "mlp_digits.py"


def load_example():
    spec = importlib.util.spec_from_file_location("mlp_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example():
    return load_example()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The digits MLP with its first layer frozen, through the pock-compile console script with its
    stderr on a terminal, as in an interactive shell; returns (bundle, what the terminal showed)."""
    root = tmp_path_factory.mktemp("tools")
    (root / "sparse.yaml").write_text('default: full\n"0": frozen\n')
    leader, follower = pty.openpty()
    try:
        result = subprocess.run(
            [
                VENV_BIN / "pock-compile",
                EXAMPLE,
                "--optimizer",
                "sgd:lr=0.1,momentum=0.9",
                "--sparse",
                root / "sparse.yaml",
                "--no-cache",
                "-o",
                root / "bundle",
            ],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
        )
        os.close(follower)
        shown = b""
        while chunk := _read_pty(leader):
            shown += chunk
    finally:
        os.close(leader)
    assert result.returncode == 0, shown.decode()
    assert "wrote" in result.stdout
    return root / "bundle", shown.decode()


@pytest.fixture(scope="module")
def bundle(compiled):
    return compiled[0]


@pytest.fixture(scope="module")
def data(example, tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "digits.npz"
    np.savez(path, **example.load_data())
    return path


def test_manifest_describes_the_module(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["format"] == "pock-bundle" and manifest["model"] == "mlp_digits.py"
    assert manifest["target"]["name"] == "host" and manifest["target"]["drivers"] == ["local-task", "local-sync"]
    assert set(manifest["versions"]) >= {"pock-mlir", "iree-base-compiler", "iree-base-runtime", "torch"}
    assert manifest["optimizer"] == {
        "name": "sgd",
        "lr": 0.1,
        "momentum": 0.9,
        "dampening": 0.0,
        "weight_decay": 0.0,
        "nesterov": False,
    }
    assert manifest["trainable"] == ["2.weight", "2.bias", "4.weight", "4.bias"]
    assert manifest["sparse"]["policies"]["0.weight"]["kind"] == "frozen"
    assert manifest["sparse"]["policies"]["4.bias"]["kind"] == "full"
    assert manifest["batch"]["inputs"] == [{"name": "input0", "shape": [64, 64], "dtype": "float32"}]
    assert manifest["batch"]["target"] == {"name": "target", "shape": [64], "dtype": "int32"}
    assert "functions" not in manifest  # a Trainer reads none of it: functions.json holds it
    functions = json.loads((bundle / "functions.json").read_text())
    step = functions[TRAIN_STEP]
    assert [a["path"] for a in step["arguments"]][:6] == [
        f"params/{n}.npy" for n in ("0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias")
    ]
    assert [a["path"] for a in step["arguments"]][-3:] == ["optimizer/step.npy", "batch/input0.npy", "batch/target.npy"]
    assert [r["path"] for r in step["results"]][:2] == ["loss.npy", "params/2.weight.npy"]
    assert set(functions) == {TRAIN_STEP, GRADIENTS, LOSS, EVALUATE, LOSS_TRAIN, EVALUATE_TRAIN}
    for argument in step["arguments"]:  # what iree-run-module reads
        array = np.load(bundle / "args" / argument["path"])
        assert list(array.shape) == argument["shape"] and str(array.dtype) == argument["dtype"], argument["path"]


def test_run_step_script_matches_the_python_runtime(bundle, example, tmp_path):
    env = dict(os.environ, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")  # the stock iree-run-module
    subprocess.run(["sh", bundle / "run_step.sh", tmp_path / "out"], env=env, check=True, capture_output=True)
    trainer = Trainer.from_bundle(bundle)
    loss = trainer.step(*example.example_batch())
    assert float(np.load(tmp_path / "out" / "loss.npy")) == pytest.approx(loss, rel=1e-6)
    state, optimizer = trainer.state_dict(), trainer.optimizer_state()
    for name in ("2.weight", "4.bias"):
        np.testing.assert_allclose(
            np.load(tmp_path / "out" / "params" / f"{name}.npy"), state[name], rtol=1e-6, atol=1e-7
        )
        np.testing.assert_allclose(
            np.load(tmp_path / "out" / "optimizer" / f"{name}.momentum_buffer.npy"),
            optimizer[f"{name}.momentum_buffer"],
            rtol=1e-6,
            atol=1e-7,
        )
    assert not (tmp_path / "out" / "params" / "0.weight.npy").exists()  # frozen: an argument only
    assert float(np.load(tmp_path / "out" / "optimizer" / "step.npy")) == 1


def host_copies(root) -> list[np.ndarray | bytes]:
    """The numpy arrays and bytes reachable from `root` through containers, bound methods and
    pock_mlir's objects, but for the Trainer's batch and loss slots: views of device buffers it maps (on a CPU
    driver), which hold no host memory of their own (pock_mlir/runtime/workspace.py BatchSlots,
    LossSlot)."""
    seen, found, todo = set(), [], [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (BatchSlots, LossSlot)):
            continue
        seen.add(id(obj))
        if isinstance(obj, (np.ndarray, bytes)):
            found.append(obj)
        elif isinstance(obj, dict):
            todo += [*obj.keys(), *obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        elif inspect.ismethod(obj):
            todo.append(obj.__self__)
        elif type(obj).__module__.startswith("pock_mlir") and hasattr(obj, "__dict__"):
            todo += list(vars(obj).values())
    return found


def test_a_bundle_records_what_its_step_writes_in_place(bundle, example, tmp_path):
    """The manifest's in_place is what the Trainer from the bundle writes in place; a bundle
    written before it was recorded (its "state_in_place" flag) keeps the optimizer state in place
    where the flag says so, and the parameters in two sets."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["module"]["in_place"] == ["optimizer", "params"]
    trainer = Trainer.from_bundle(bundle)
    assert trainer.in_place == {"optimizer", "params"}
    old = tmp_path / "old"
    shutil.copytree(bundle, old)
    del manifest["module"]["in_place"]
    manifest["module"]["state_in_place"] = True
    (old / "manifest.json").write_text(json.dumps(manifest))
    old_trainer = Trainer.from_bundle(old)
    assert old_trainer.in_place == {"optimizer"}
    batch = example.example_batch()
    assert [old_trainer.step(*batch) for _ in range(3)] == [trainer.step(*batch) for _ in range(3)]


def test_a_trainer_from_a_bundle_holds_no_host_copy_of_its_tensors_or_module(bundle, example):
    """Its parameters and optimizer state live on the device; the bundle's host copies are freed.
    IREE reads the module from its mapped file: no bytes of it are held either."""
    trainer = Trainer.from_bundle(bundle)
    trainer.step(*example.example_batch())
    module_bytes = (bundle / "module.vmfb").stat().st_size
    copies = [c for c in host_copies(trainer) if isinstance(c, np.ndarray) or len(c) >= module_bytes // 2]
    assert not copies, [getattr(c, "shape", len(c)) for c in copies]


def torch_accuracy(model, x, y, batch):
    full = len(x) // batch * batch
    with torch.no_grad():
        predicted = model(torch.from_numpy(x[:full])).argmax(1).numpy()
    return float((predicted == y[:full]).mean())


def test_train_reports_progress_evaluates_and_exports_a_torch_state_dict(bundle, data, example, tmp_path):
    export = tmp_path / "tuned.safetensors"
    result = subprocess.run(
        [
            VENV_BIN / "pock-train",
            bundle,
            "--data",
            data,
            "--epochs",
            "2",
            "--batch-size",
            "64",
            "--checkpoint",
            tmp_path / "run.ckpt",
            "--export",
            export,
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and "val_loss" in epochs[1] and "val_accuracy" in epochs[1]
    assert "epoch 2/2 [" in result.stderr and "steps/s" in result.stderr
    assert "\r" not in result.stderr  # a pipe gets whole lines, not a terminal's redraws
    assert [line.split(" [")[0] for line in result.stderr.splitlines()] == ["epoch 1/2", "epoch 2/2"]
    assert (tmp_path / "run.ckpt").exists()

    model = example.model()
    initial = {n: v.clone() for n, v in model.state_dict().items()}
    model.load_state_dict(load_file(export))  # strict: every parameter and buffer is there
    assert torch.equal(model.state_dict()["0.weight"], initial["0.weight"])  # frozen
    assert not torch.equal(model.state_dict()["4.weight"], initial["4.weight"])
    reported = float(epochs[1].split("val_accuracy ")[1].split(",")[0])
    values = example.load_data()
    assert torch_accuracy(model, values["x_val"], values["y_val"], 64) == pytest.approx(reported, abs=1e-4)
    assert reported > 0.5


def write_npz(path, **arrays):
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d.update(x_train=d["x_train"][:, :63]),
            "x_train has samples of shape (63,), the bundle takes (64,)",
        ),
        (lambda d: d.update(x_val=d["x_val"].astype(np.float64)), "x_val has dtype float64, the bundle takes float32"),
        (
            lambda d: d.update(y_train=d["y_train"].astype(np.float32)),
            "y_train has dtype float32, the bundle takes int32",
        ),
        (lambda d: d.pop("y_val"), "lacks y_val"),
        (lambda d: d.update(y_train=d["y_train"][:100]), "x_train has 1437 samples and y_train has 100 samples"),
    ],
    ids=["sample shape", "input dtype", "target dtype", "missing array", "sample counts"],
)
def test_data_that_does_not_fit_is_refused(bundle, example, tmp_path, capsys, change, message):
    arrays = example.load_data()
    change(arrays)
    path = write_npz(tmp_path / "bad.npz", **arrays)
    export = tmp_path / "tuned.safetensors"
    assert (
        pock_train.main(
            [str(bundle), "--data", str(path), "--checkpoint", str(tmp_path / "c.ckpt"), "--export", str(export)]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not export.exists() and not (tmp_path / "c.ckpt").exists()


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--batch-size", "32"], "the bundle was compiled for batches of 64"),
        (["--device", "vulkan"], "runs on device local-task or local-sync, not 'vulkan'"),
        (["--resume"], "--resume needs --checkpoint"),
        (["--epochs", "0"], "--epochs must be at least 1"),
    ],
)
def test_bad_arguments_are_refused(bundle, data, capsys, arguments, message):
    assert pock_train.main([str(bundle), "--data", str(data), *arguments]) == 1
    assert message in capsys.readouterr().err


def test_not_a_bundle_and_not_an_npz(bundle, data, tmp_path):
    np.save(tmp_path / "one.npy", np.zeros(3))
    for arguments, message in [
        ([tmp_path, "--data", data], "is not a pock bundle (no manifest.json)"),
        ([bundle, "--data", tmp_path / "one.npy"], "is a single array"),
        ([bundle, "--data", tmp_path / "missing.npz"], "cannot read"),
    ]:
        result = subprocess.run([VENV_BIN / "pock-train", *arguments], capture_output=True, text=True)
        assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    "model_text, arguments, message",
    [
        (None, ["--target", "arm"], "unknown target 'arm'"),
        (None, ["--optimizer", "sgd:lr=-1"], "SGD lr must be > 0"),
        (None, ["--optimizer", "rmsprop:lr=1"], "unknown optimizer 'rmsprop'"),
        ("import torch\ndef model():\n    return torch.nn.Linear(2, 2)\n", [], "must define example_batch()"),
        (
            "def model():\n    raise RuntimeError('no weights')\ndef example_batch():\n    pass\n",
            [],
            "failed: RuntimeError: no weights",
        ),
    ],
)
def test_compile_errors_are_one_message(tmp_path, capsys, model_text, arguments, message):
    model = EXAMPLE
    if model_text is not None:
        model = tmp_path / "model.py"
        model.write_text(model_text)
    assert pock_compile.main([str(model), "-o", str(tmp_path / "bundle"), *arguments]) == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "bundle").exists()


@pytest.mark.parametrize(
    "tool, name, kind",
    [
        ("pock-compile", "model.txt", "a .txt file"),
        ("pock-search", "model.onnx", "a .onnx file"),
        ("pock-compile", "model", "a file without the .py suffix"),
    ],
)
def test_a_model_file_of_another_kind_is_one_line(tmp_path, tool, name, kind):
    (tmp_path / name).write_bytes(b"\x08\x07onnx")
    output = (
        ["-o", tmp_path / "out.yaml", "--data", tmp_path / "data.npz", "--memory-budget", "1MB"]
        if tool == "pock-search"
        else ["-o", tmp_path / "out"]
    )
    result = subprocess.run([VENV_BIN / tool, tmp_path / name, *output], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"{tmp_path / name} is {kind}; a model file is Python source named MODEL.py" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written


def test_compile_says_an_onnx_file_it_cannot_read_in_one_line(tmp_path):
    """pock-compile takes MODEL.onnx (docs/onnx.md); a file that is no ONNX model is one line."""
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07onnx")
    result = subprocess.run(
        [VENV_BIN / "pock-compile", tmp_path / "model.onnx", "-o", tmp_path / "out"], capture_output=True, text=True
    )
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"{tmp_path / 'model.onnx'}: not a readable ONNX model" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]  # nothing written


def test_compile_refuses_to_replace_a_directory_that_is_not_a_bundle(tmp_path, capsys):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    assert pock_compile.main([str(EXAMPLE), "-o", str(tmp_path / "precious")]) == 1
    assert "exists and is not a pock bundle" in capsys.readouterr().err
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


EXAMPLE_MODELS = sorted(p.name for p in (REPO / "examples").glob("*.py") if "def example_batch(" in p.read_text())


@pytest.mark.parametrize("name", EXAMPLE_MODELS)
def test_example_model_files_follow_the_contract(name):
    """Each example loads as pock-compile loads it, and its data fits its example batch."""
    model, inputs, target, loss, *_ = pock_compile.load_model_file(str(REPO / "examples" / name))
    with torch.no_grad():
        assert resolve_loss(loss)(model(inputs), target).dim() == 0
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = module.load_data()
    if "tokens_train" in data:  # a tokenized text, which pock-train cuts into windows of the batch's length
        for split in ("train", "val"):
            tokens = data[f"tokens_{split}"]
            assert tokens.ndim == 1 and np.issubdtype(tokens.dtype, np.integer) and len(tokens) > inputs.numel()
        return
    for split in ("train", "val"):
        assert (
            data[f"x_{split}"].shape[1:] == tuple(inputs.shape[1:]) and data[f"x_{split}"].dtype == inputs.numpy().dtype
        )
        assert (
            data[f"y_{split}"].shape[1:] == tuple(target.shape[1:]) and data[f"y_{split}"].dtype == target.numpy().dtype
        )


def test_compile_shows_its_stages_on_a_terminal(compiled):
    """On a terminal pock-compile says what it is doing before each long stage (in a pipe it is
    quiet: tests/test_readme_commands.py checks that)."""
    shown = compiled[1]
    assert shown.index("exporting the model") < shown.index("autodiff stage done") < shown.index("compiling with IREE")
    # then where the time went: each import step, each pass of each stage, IREE's halves
    report = shown[shown.index("compile time:") :]
    steps = re.findall(r"^  (.+?) +(\d+\.\d\d)s +(\d+\.\d)%", report, re.M)
    names = [name for name, _, _ in steps]
    assert {
        "import: torch.export of the forward and loss",
        "autodiff: pock-autodiff",
        "sparse: pock-sparse-bp",
        "lowered: pock-backend-switch",
        "iree: code generation",
    } <= set(names), report
    assert sum(float(share) for _, _, share in steps) == pytest.approx(100, abs=0.5)


def _read_pty(fd) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:  # EIO: the terminal's other end is closed and everything was read
        return b""


def test_pock_opt_reads_and_moves_ir_without_pytorch():
    """pock-opt imports PyTorch only when a pass builds ops (meta tensors give their types): listing,
    parsing, verifying and the passes that only move or erase ops start in a fraction of the time."""
    lit_input = REPO / "lit_tests" / "passes" / "pock-reorder-updates.mlir"
    code = (
        "import contextlib, io, sys; from pock_mlir.tools import pock_opt\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    codes = [pock_opt.main(['--list-passes']), pock_opt.main(['-p', 'pock-reorder-updates,pock-dce', {str(lit_input)!r}])]\n"
        "print(codes, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[0, 0] False", done.stderr


def test_pock_ops_do_not_each_search_for_the_dialect_module():
    """The MLIR bindings import a dialect's Python module for each op of it they wrap, and search
    again on the next op while none is found: pock's module is on their search path, so a pass
    over many pock ops looks it up once, not once per op."""
    lit_input = REPO / "lit_tests" / "passes" / "pock-reorder-updates.mlir"
    code = (
        "import contextlib, io, sys\n"
        "searched = []\n"
        "class Tracer:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        searched.append(name)\n"
        "sys.meta_path.insert(0, Tracer())\n"
        "from pock_mlir.tools import pock_opt\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = pock_opt.main(['-p', 'pock-reorder-updates,pock-dce', {str(lit_input)!r}])\n"
        "print(code, sum(name.endswith('.pock') and name not in sys.modules for name in searched))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    exit_code, _, searches = done.stdout.strip().partition(" ")
    assert exit_code == "0", done.stderr
    assert int(searches) <= 1  # torch_mlir.dialects.pock, once: pock_mlir.dialects.pock is found next
