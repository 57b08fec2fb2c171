"""The IREE driver a Trainer steps a program on, chosen per program by pock-backend-switch (#65):
on a CPU target, local-sync (every dispatch in the calling thread) where the program of the
table's driver study (python -m bench.drivers) nearest in FLOPs was faster on it, else the
target's default, local-task. The choice reaches the Trainer, the bundle (its manifest and
run_step.sh) and pock-train; an explicit device still wins. The tables here are written by the
tests; the shipped ones are checked to choose each program they measured by its own row."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from oracle import assert_trajectory_close

import pock_mlir as pock
import pock_mlir.tuning as tuning
from pock_mlir.bundle import write_bundle
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.bundle import BundleError, load_bundle
from pock_mlir.stages import pipelines_with_switch
from pock_mlir.targets import CPU_DRIVERS, CUDA_DRIVERS
from pock_mlir.tuning import LOCAL_SYNC, LOCAL_TASK, MatmulFlops, Measured

OPTIMIZER = pock.SGD(lr=0.1, momentum=0.9)
# two measured programs: a 2 MFLOP step faster on local-sync, a 2 GFLOP one slower there
SMALL = MatmulFlops(convolutions=0, matmuls=2_000_000, largest_matmul=1_000_000, untiled_matmuls=0, softmaxes=0)
LARGE = MatmulFlops(convolutions=0, matmuls=2_000_000_000, largest_matmul=10**9, untiled_matmuls=0, softmaxes=0)
STEP_MS = {"small": {LOCAL_TASK: 0.20, LOCAL_SYNC: 0.12}, "large": {LOCAL_TASK: 20.0, LOCAL_SYNC: 27.0}}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("drivers") / "table.json"
    programs = {"small": dataclasses.asdict(SMALL), "large": dataclasses.asdict(LARGE)}
    path.write_text(json.dumps({"drivers": {"programs": programs, "step_ms": STEP_MS}}))
    return path


def mlp(width: int, rows: int):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = nn.Sequential(nn.Linear(64, width), nn.ReLU(), nn.Linear(width, 10))
    return model, torch.randn(rows, 64, generator=g), torch.randint(0, 10, (rows,), generator=g)


def flops(total: int) -> MatmulFlops:
    return MatmulFlops(convolutions=0, matmuls=total, largest_matmul=total, untiled_matmuls=0, softmaxes=0)


def test_the_driver_is_the_faster_one_of_the_program_nearest_in_flops(table):
    measured = tuning.Tuning.from_file(str(table))
    for total, driver, nearest in [
        (10**5, LOCAL_SYNC, "small"),
        (5 * 10**7, LOCAL_SYNC, "small"),
        (10**11, LOCAL_TASK, "large"),
    ]:
        choice = tuning.choose_driver(measured, flops(total), CPU_DRIVERS)
        assert choice.form == driver and choice.measured == Measured(nearest, STEP_MS[nearest]), choice
    ratio = STEP_MS["large"][LOCAL_SYNC] / STEP_MS["large"][LOCAL_TASK]
    assert choice.reason == (
        f"100000 MFLOP of matmuls and convolutions; the step nearest in size measured on {measured.name}, "
        f"large (2000 MFLOP), took {ratio:.2f}x the time on local-sync"
    )


def test_without_any_driver_measurements_the_size_decides_and_without_a_second_driver_the_default(table):
    unmeasured = tuning.Tuning("a table of no driver study", {})
    choice = tuning.choose_driver(unmeasured, SMALL, CPU_DRIVERS)
    assert choice.form == LOCAL_SYNC and choice.measured is None
    assert choice.reason == (
        "no driver measurements for a table of no driver study (python -m bench.drivers): "
        "2 MFLOP of matmuls and convolutions, under 40"
    )
    at_the_bound = tuning.choose_driver(unmeasured, flops(tuning.UNMEASURED_SYNC_FLOPS), CPU_DRIVERS)
    assert at_the_bound.form == LOCAL_TASK and at_the_bound.reason.endswith(
        "40 MFLOP of matmuls and convolutions, not under 40"
    )
    assert tuning.choose_driver(unmeasured, LARGE, CPU_DRIVERS).form == LOCAL_TASK
    gpu = tuning.choose_driver(tuning.Tuning.from_file(str(table)), SMALL, CUDA_DRIVERS)
    assert gpu.form == CUDA_DRIVERS[0] and gpu.measured is None


def test_a_table_without_driver_measurements_borrows_another_cpus_study(table):
    unmeasured = tuning.Tuning("a table of no driver study", {})
    borrowed = tuning.Tuning.from_file(str(table))
    choice = tuning.choose_driver(unmeasured, SMALL, CPU_DRIVERS, borrowed)
    assert choice.form == LOCAL_SYNC and choice.measured == Measured("small", STEP_MS["small"]), choice
    assert f"measured on {borrowed.name}, as a table of no driver study has no driver measurements" in choice.reason
    assert tuning.choose_driver(unmeasured, LARGE, CPU_DRIVERS, borrowed).form == LOCAL_TASK
    own = tuning.choose_driver(borrowed, SMALL, CPU_DRIVERS, unmeasured)  # a table's own study comes first
    assert own.form == LOCAL_SYNC and own.measured.case == "small"


def test_the_borrowed_study_is_the_nearest_other_cpus_never_this_ones(tmp_path, monkeypatch):
    study = {"drivers": {"programs": {"small": dataclasses.asdict(SMALL)}, "step_ms": {"small": STEP_MS["small"]}}}
    tables = {
        "x86_64-AuthenticAMD-25-17": study,  # this CPU's own, in the first case
        "x86_64-AuthenticAMD-25-1": study,
        "x86_64-AuthenticAMD-26-2": {},  # nearer than the Intel, but without a study
        "x86_64-GenuineIntel-6-207": study,
        "aarch64-0x41-0xd0c": study,
    }
    for cpu, table in tables.items():
        (tmp_path / f"host-{cpu}.json").write_text(json.dumps(table))
    monkeypatch.setattr(tuning, "TUNING_DIR", tmp_path)
    for cpu, lender in [
        ("x86_64-AuthenticAMD-25-17", "x86_64-AuthenticAMD-25-1"),
        ("x86_64-AuthenticAMD-26-2", "x86_64-AuthenticAMD-25-1"),
        ("x86_64-GenuineIntel-6-167", "x86_64-GenuineIntel-6-207"),
        ("aarch64-0x41-0xd08", "aarch64-0x41-0xd0c"),
        ("riscv64", None),
    ]:
        monkeypatch.setattr(tuning, "host_cpu", lambda cpu=cpu: cpu)
        borrowed = tuning.borrowed_driver_study()
        assert (borrowed and borrowed.name) == (lender and f"target 'host' (CPU {lender})"), cpu


def test_on_a_cpu_without_a_table_a_small_step_runs_on_local_sync_by_a_shipped_study(monkeypatch):
    """As on a CPU with no table of its own whose nearest shipped table has no driver study (an
    Intel of family 6 model 167, say, whose nearest is model 207's): another CPU's study decides."""
    shipped = {p.stem.removeprefix("host-"): json.loads(p.read_text()) for p in tuning.TUNING_DIR.glob("host-*.json")}
    unstudied = sorted(cpu for cpu, table in shipped.items() if "drivers" not in table and cpu.count("-") == 3)
    if not unstudied:
        pytest.skip("every shipped CPU table has a driver study")
    unmeasured = f"{unstudied[0]}-0"  # a CPU whose nearest table is that one
    monkeypatch.setattr(tuning, "host_cpu", lambda: unmeasured)
    assert tuning.table_path("host").stem == f"host-{unstudied[0]}"
    model, x, y = mlp(16, 4)
    program = pock.compile_training(model, x, y, optimizer=OPTIMIZER, functions=(), cache=False)
    lender = tuning.borrowed_driver_study()
    assert program.driver.form == LOCAL_SYNC and lender.name in program.driver.reason, program.driver
    assert program.driver.measured.case in lender.table["drivers"]["step_ms"]


@pytest.mark.parametrize(
    "study",
    [
        {"programs": {"small": {"flops": 1}}},
        {"programs": {"small": dataclasses.asdict(SMALL)}, "step_ms": {"small": {"local-task": 1}}},
        {"programs": {}, "step_ms": {"small": STEP_MS["small"]}},
    ],
)
def test_a_malformed_driver_study_is_one_clear_error(tmp_path, study):
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"drivers": study}))
    with pytest.raises(ValueError, match=f"tuning table '{path}' is not one python -m bench.iree_study writes"):
        tuning.Tuning.from_file(str(path))


@pytest.fixture(scope="module")
def small_program(table):
    """A step of about 0.1 MFLOP: nearest the small measured program."""
    model, x, y = mlp(16, 4)
    program = pock.compile_training(
        model, x, y, optimizer=OPTIMIZER, pipelines=pipelines_with_switch(f"tuning={table}"), functions=("step",)
    )
    return model, x, y, program


def test_a_small_step_trains_on_local_sync_as_torch_optim(small_program):
    model, x, y, program = small_program
    assert program.driver.form == LOCAL_SYNC and program.driver.measured.case == "small", program.driver
    assert f"\ndriver: local-sync ({program.driver.reason})" in program.backend_report()
    trainer = program.trainer()
    assert trainer.device_name == LOCAL_SYNC
    losses = [trainer.step(x, y) for _ in range(3)]
    assert_trajectory_close(losses, trainer.state_dict(), model, x, y, OPTIMIZER, 3, what="local-sync")
    assert program.trainer(device=LOCAL_TASK).device_name == LOCAL_TASK  # asked for, it wins


def test_a_large_step_keeps_local_task(table):
    """About 1.6 GFLOP (a 2048-row batch through 64 -> 4096 -> 10): nearest the large program."""
    model, x, y = mlp(4096, 2048)
    program = pock.compile_training(
        model, x, y, optimizer=OPTIMIZER, pipelines=pipelines_with_switch(f"tuning={table}"), functions=()
    )
    assert program.driver.form == LOCAL_TASK and program.driver.measured.case == "large", program.driver


def test_a_bundle_keeps_the_chosen_driver_for_pock_train_and_run_step(small_program, tmp_path):
    model, x, y, program = small_program
    path = write_bundle(program, tmp_path / "bundle", example_inputs=x, example_target=y, loss="cross_entropy")
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["target"]["driver"] == LOCAL_SYNC and manifest["target"]["driver_reason"] == program.driver.reason
    assert '--device="${IREE_DEVICE:-local-sync}"' in (path / "run_step.sh").read_text()
    bundle = load_bundle(path)
    assert bundle.driver == LOCAL_SYNC
    assert Trainer.from_bundle(bundle).device_name == LOCAL_SYNC


def test_a_bundle_naming_a_driver_its_target_lacks_is_one_clear_error(small_program, tmp_path):
    model, x, y, program = small_program
    path = write_bundle(program, tmp_path / "bundle", example_inputs=x, example_target=y, loss="cross_entropy")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["target"]["driver"] = "cuda"
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        BundleError,
        match="its driver 'cuda' is not one of target 'host' \\(local-task, local-sync\\); rewrite the bundle",
    ):
        load_bundle(path)


@pytest.mark.parametrize("path", sorted(tuning.TUNING_DIR.glob("host-*.json")), ids=lambda p: p.stem)
def test_each_shipped_driver_study_chooses_each_program_it_measured_by_its_own_row(path):
    study = tuning.Tuning.from_file(str(path))
    measured = study.table.get("drivers", {}).get("step_ms", {})
    for model, ms in measured.items():
        choice = tuning.choose_driver(study, MatmulFlops(**study.table["drivers"]["programs"][model]), CPU_DRIVERS)
        assert choice.measured == Measured(model, ms), choice
        faster = ms[LOCAL_SYNC] <= tuning.MAX_CHOSEN_RATIO * ms[LOCAL_TASK]
        assert choice.form == (LOCAL_SYNC if faster else LOCAL_TASK)
        assert math.isfinite(ms[LOCAL_SYNC] / ms[LOCAL_TASK]) and np.all(np.array(list(ms.values())) > 0)
