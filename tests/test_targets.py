"""Each target's module on this machine: portable x86-64 and Vulkan (lavapipe) through the Python
runtime, aarch64 under qemu-aarch64 with IREE's aarch64 iree-run-module and the bundle's
run_step.sh, CUDA compiled only (no GPU here). All are compared with the host module.

tools/setup_device_deps.sh (run by `make test`) installs qemu, lavapipe and the aarch64 runtime;
without them the tests that need them skip, saying what is missing.
"""

import gc
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import pock_mlir as pock
from pock_mlir.abi import EVALUATE, EVALUATE_TRAIN, GRADIENTS, LOSS, LOSS_TRAIN, TRAIN_STEP
from pock_mlir.bundle import write_bundle
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.bundle import load_bundle
from pock_mlir.targets import TargetError, resolve_target
from pock_mlir.tools import pock_compile, pock_train

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")
AARCH64_RUN_MODULE = REPO / ".cache" / "iree-aarch64" / version("iree-base-runtime") / "iree-run-module"
SETUP = "run tools/setup_device_deps.sh (make test does)"
STEPS = 3


def make_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))  # tiny: qemu is 30-100x slower


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(4, 12, generator=g), torch.randint(0, 5, (4,), generator=g)


@pytest.fixture(scope="module")
def programs(batch):
    """target name -> TrainingProgram, each compiled on first use."""
    compiled = {}

    def get(target):
        if target not in compiled:
            compiled[target] = pock.compile_training(
                make_mlp(), *batch, optimizer=pock.SGD(lr=0.1, momentum=0.9), target=target, functions="all"
            )  # trainers' and bundles
        return compiled[target]

    return get


@pytest.fixture(scope="module")
def bundles(programs, batch, tmp_path_factory):
    """target name -> bundle directory, each written on first use."""
    written = {}

    def get(target):
        if target not in written:
            written[target] = write_bundle(
                programs(target),
                tmp_path_factory.mktemp("bundle") / target.replace(":", "_"),
                example_inputs=batch[0],
                example_target=batch[1],
                loss="cross_entropy",
            )
        return written[target]

    return get


def trajectory(trainer, batch):
    losses = [trainer.step(*batch) for _ in range(STEPS)]
    return losses, trainer.state_dict(), trainer.optimizer_state()


def assert_same_results(got, want):
    """Different code generators round differently (vector widths, FMA contraction): float32 noise only."""
    (losses, params, state), (want_losses, want_params, want_state) = got, want
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    for name in want_params:
        np.testing.assert_allclose(params[name], want_params[name], rtol=1e-5, atol=1e-6, err_msg=name)
    for name in want_state:
        np.testing.assert_allclose(state[name], want_state[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.fixture(scope="module")
def host_results(programs, batch):
    return trajectory(programs("host").trainer(), batch)


@pytest.fixture(scope="module")
def iree_compile_help():
    return subprocess.run([VENV_BIN / "iree-compile", "--help"], capture_output=True, text=True).stdout


@pytest.mark.parametrize(
    "spec",
    [
        "host",
        "x86-64",
        "x86-64:generic",
        "aarch64",
        "aarch64:+dotprod,+sve",
        "vulkan",
        "vulkan:valhall4",
        "cuda",
        "cuda:sm_80",
    ],
)
def test_every_flag_exists_in_this_iree_compile(spec, iree_compile_help):
    for flag in resolve_target(spec).compile_flags():
        name = flag.split("=")[0]
        assert re.search(rf"^\s+{re.escape(name)}[=\s]", iree_compile_help, re.M), f"{spec}: iree-compile has no {name}"


def test_target_flags():
    assert resolve_target("x86-64:generic").compile_flags() == [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-triple=x86_64-unknown-linux-gnu",
        "--iree-llvmcpu-target-cpu=generic",
        "--iree-llvmcpu-vector-pproc-strategy=peel",
        "--iree-global-opt-use-im2col-for-convs",
        "--iree-global-opt-enable-sink-transpose-through-pad",
        "--iree-llvmcpu-debug-symbols=false",
        "--iree-torch-externalize-transients",
    ]
    assert "--iree-llvmcpu-target-cpu-features=+dotprod,+sve" in resolve_target("aarch64:+dotprod,+sve").compile_flags()
    assert not any("pproc" in f for f in resolve_target("aarch64").compile_flags())  # measured on x86 only
    assert resolve_target("vulkan").compile_flags() == [
        "--iree-hal-target-device=vulkan",
        "--iree-vulkan-target=vp_android_baseline_2022",
        "--iree-input-demote-i64-to-i32",
        "--iree-torch-externalize-transients",
    ]
    assert resolve_target("cuda").compile_flags() == [
        "--iree-hal-target-device=cuda",
        "--iree-cuda-target=sm_87",
        "--iree-codegen-llvmgpu-use-reduction-vector-distribution=false",
        "--iree-torch-externalize-transients",
    ]


def test_the_tools_read_the_targets_from_the_one_table():
    """pock-compile's --target help, pock-train's --device choices and pock-backend-switch's
    target option (pock-opt) list TARGETS; each row resolves to a target of its drivers."""
    from pock_mlir.passes.pock_backend_switch import BackendSwitchPass

    from pock_mlir.targets import DRIVERS, TARGETS
    from pock_mlir.tools import pock_opt

    for kind in TARGETS.values():
        assert resolve_target(kind.name).drivers == kind.drivers
    assert set(DRIVERS) == {driver for kind in TARGETS.values() for driver in kind.drivers}
    compile_help = " ".join(pock_compile.build_parser().format_help().split())
    assert all(kind.usage() in compile_help for kind in TARGETS.values()), compile_help
    (device,) = [a for a in pock_train.build_parser()._actions if "--device" in a.option_strings]
    assert tuple(device.choices) == DRIVERS
    assert f"the target ({', '.join(TARGETS)})" in BackendSwitchPass.option_help()["target"]
    assert BackendSwitchPass.option_help()["target"] in pock_opt.list_passes()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("arm", "unknown target 'arm'"),
        ("x86-64:zen9", "x86-64 takes generic"),
        ("aarch64:dotprod", "starting with +"),
        ("cuda:87", "compute capability like sm_87"),
        ("host:avx", "takes no option"),
    ],
)
def test_bad_target_names_say_what_is_accepted(spec, message):
    with pytest.raises(TargetError, match=message):
        resolve_target(spec)


def test_portable_x86_64_matches_host(programs, batch, host_results):
    assert_same_results(trajectory(programs("x86-64:generic").trainer(), batch), host_results)


def test_cpu_modules_carry_no_debug_information(programs):
    for target in ("host", "x86-64:generic"):
        vmfb = next(iter(programs(target).modules.values())).vmfb
        assert b".debug_info" not in vmfb and b".debug_line" not in vmfb, target


def test_vulkan_on_lavapipe_matches_host(programs, bundles, batch, host_results):
    if not list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd.*.json")):
        pytest.skip(f"lavapipe (Debian mesa-vulkan-drivers) is not installed; {SETUP}")
    assert_same_results(trajectory(programs("vulkan").trainer(), batch), host_results)
    # The bundle through the Python runtime: gradients and outputs come back through staging buffers too.
    trainer = Trainer.from_bundle(bundles("vulkan"), device="vulkan")
    loss, grads = trainer.gradients(*batch)
    want_loss, want_grads = programs("host").trainer().gradients(*batch)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for name in want_grads:
        np.testing.assert_allclose(grads[name], want_grads[name], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trainer.evaluate(batch[0]), make_mlp()(batch[0]).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_dropped_vulkan_trainer_leaves_no_thread_polling(programs, batch):
    """A Vulkan device on lavapipe keeps two threads polling while it exists; a trainer's device is its
    own and goes with it (iree.runtime's shared ones live as long as the process), so a process that
    ran a Vulkan step does not keep two cores busy afterwards (it did: a test worker, for the rest
    of the suite)."""
    if not list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd.*.json")):
        pytest.skip(f"lavapipe (Debian mesa-vulkan-drivers) is not installed; {SETUP}")
    trainer = programs("vulkan").trainer()
    trainer.step(*batch)
    del trainer
    gc.collect()
    before = os.times()
    time.sleep(1)
    after = os.times()
    assert (after.user + after.system) - (before.user + before.system) < 0.5, "the process is busy while idle"


EXAMPLES_ON_VULKAN = ["mlp_digits.py", "tiny_llama.py"]  # their own batches: 64 samples; 8 sequences of 16 tokens


@pytest.mark.parametrize("name", EXAMPLES_ON_VULKAN)
def test_example_model_on_vulkan_at_its_own_batch_matches_pytorch(name):
    """Class targets and token ids at the examples' real batch sizes: their index math (i64 in
    torch's decompositions) reaches the GPU path, which failed to compile at batch 64."""
    if not list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd.*.json")):
        pytest.skip(f"lavapipe (Debian mesa-vulkan-drivers) is not installed; {SETUP}")
    from oracle import assert_gradients_close, assert_trajectory_close, torch_gradients

    model, inputs, target, loss, *_ = pock_compile.load_model_file(str(REPO / "examples" / name))
    optimizer = pock.SGD(lr=0.1, momentum=0.9)
    trainer = pock.compile_training(
        model, inputs, target, loss=loss, optimizer=optimizer, target="vulkan", functions=("step", "gradients")
    ).trainer()  # one module for both
    want_loss, want_grads = torch_gradients(model, inputs, target, loss)
    got_loss, got_grads = trainer.gradients(inputs, target)
    assert got_loss == pytest.approx(want_loss, rel=1e-4)
    assert_gradients_close(got_grads, want_grads)
    losses = [trainer.step(inputs, target) for _ in range(STEPS)]
    assert_trajectory_close(losses, trainer.state_dict(), model, inputs, target, optimizer, STEPS, loss=loss)


def run_step(bundle: Path, out: Path, run_module: str) -> dict[str, np.ndarray]:
    """The bundle's run_step.sh as documented; returns its outputs by path."""
    env = dict(os.environ, IREE_RUN_MODULE=run_module)
    subprocess.run(["sh", bundle / "run_step.sh", out], env=env, check=True, capture_output=True, timeout=300)
    functions = json.loads((bundle / "functions.json").read_text())
    return {r["path"]: np.load(out / r["path"]) for r in functions[TRAIN_STEP]["results"]}


def test_aarch64_module_under_qemu_matches_host(bundles, tmp_path):
    if platform.machine() == "aarch64":
        run_module = str(VENV_BIN / "iree-run-module")
    else:
        missing = [
            what
            for what, ok in [
                ("qemu-aarch64 (Debian qemu-user)", shutil.which("qemu-aarch64")),
                (
                    f"{AARCH64_SYSROOT} (Debian libc6-arm64-cross)",
                    (AARCH64_SYSROOT / "lib/ld-linux-aarch64.so.1").exists(),
                ),
                ("libstdc++6-arm64-cross", (AARCH64_SYSROOT / "lib/libstdc++.so.6").exists()),
                (f"IREE's aarch64 iree-run-module at {AARCH64_RUN_MODULE}", AARCH64_RUN_MODULE.exists()),
            ]
            if not ok
        ]
        if missing:
            pytest.skip(f"missing {', '.join(missing)}; {SETUP}")
        run_module = f"qemu-aarch64 -L {AARCH64_SYSROOT} {AARCH64_RUN_MODULE}"
    got = run_step(bundles("aarch64"), tmp_path / "aarch64", run_module)
    want = run_step(bundles("host"), tmp_path / "host", str(VENV_BIN / "iree-run-module"))
    assert set(got) == set(want) and "loss.npy" in got and "params/0.weight.npy" in got
    for path in want:
        assert got[path].shape == want[path].shape and got[path].dtype == want[path].dtype, path
        np.testing.assert_allclose(got[path], want[path], rtol=1e-5, atol=1e-6, err_msg=path)
    assert int(got["optimizer/step.npy"]) == 1


def test_aarch64_bundle_is_refused_on_x86(bundles, tmp_path, capsys):
    if platform.machine() != "x86_64":
        pytest.skip("checks an x86-64 machine refusing an aarch64 bundle")
    with pytest.raises(TargetError, match="needs an aarch64 CPU; this machine is x86_64"):
        Trainer.from_bundle(bundles("aarch64"))
    np.savez(tmp_path / "data.npz", x_train=np.zeros((8, 12), np.float32), y_train=np.zeros(8, np.int64))
    assert pock_train.main([str(bundles("aarch64")), "--data", str(tmp_path / "data.npz")]) == 1
    assert "needs an aarch64 CPU" in capsys.readouterr().err
    assert not (bundles("aarch64") / "tuned.safetensors").exists()


def test_cuda_module_compiles_with_its_manifest(bundles):
    bundle = bundles("cuda:sm_87")
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["target"]["name"] == "cuda:sm_87"
    assert manifest["target"]["drivers"] == ["cuda"] and manifest["target"]["arch"] is None
    assert {"--iree-hal-target-device=cuda", "--iree-cuda-target=sm_87"} <= set(
        manifest["target"]["iree_compile_flags"]
    )
    functions = json.loads((bundle / "functions.json").read_text())
    assert set(functions) == {TRAIN_STEP, GRADIENTS, LOSS, EVALUATE, LOSS_TRAIN, EVALUATE_TRAIN}
    assert "IREE_DEVICE:-cuda" in (bundle / "run_step.sh").read_text()
    dump = subprocess.run(
        [VENV_BIN / "iree-dump-module", bundle / "module.vmfb"], capture_output=True, text=True
    ).stdout
    assert "cuda-nvptx-fb" in dump and 'arch = "sm_87"' in dump
    for function in (TRAIN_STEP, GRADIENTS, EVALUATE):
        assert re.search(rf"\] {function}\(", dump), function
    loaded = load_bundle(bundle)
    assert loaded.target.device == "cuda"
    with pytest.raises(TargetError, match="runs on device cuda, not 'local-task'"):
        Trainer.from_bundle(loaded, device="local-task")
