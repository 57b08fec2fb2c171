"""pock-tune's mechanics on a tiny CNN (one convolution, two flag sets): the tuning bundle, its
table measured with the runtime alone and read back, choices that follow a planted measurement,
and tables from elsewhere refused. No timings are asserted (bench/tune.py measures what tuning gains)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pock_mlir as pock
from pock_mlir.runtime import Trainer
from pock_mlir.runtime.bundle import load_bundle
from pock_mlir.runtime.timing import WARMUP_CALLS, time_interleaved
from pock_mlir.tools import pock_compile, pock_tune
from pock_mlir.tuning import TABLE_FORMAT, cpu_device, iree_version

MODEL = """
import torch
from torch import nn


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


def example_batch():
    torch.manual_seed(1)
    return torch.randn(2, 3, 6, 6), torch.tensor([1, 3])
"""
SETS = "im2col,im2col+global-data-tiling"
CONV = "dense 3x3/s1 3->4 6x6 n2"
LAVAPIPE = list(Path("/usr/share/vulkan/icd.d").glob("lvp_icd.*.json"))
AARCH64_SYSROOT = Path("/usr/aarch64-linux-gnu")
AARCH64_BENCHMARK = (
    Path(__file__).resolve().parent.parent / ".cache" / "iree-aarch64" / iree_version("iree-base-runtime")
)
AARCH64_BENCHMARK = AARCH64_BENCHMARK / "iree-benchmark-module"


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tune") / "tiny_cnn.py"
    path.write_text(MODEL)
    return path


@pytest.fixture(scope="module")
def tuned(model_file):
    """The tuning bundle and the table `pock-tune run` measured of it, in a process of its own
    that must load neither PyTorch nor the compiler."""
    bundle, table = model_file.parent / "tune-bundle", model_file.parent / "table.json"
    assert pock_tune.main(["prepare", str(model_file), "--target", "host", "-o", str(bundle), "--sets", SETS]) == 0
    code = (
        "import sys; from pock_mlir.tools.pock_tune import main; "
        f"assert main(['run', {str(bundle)!r}, '-o', {str(table)!r}, '--repeats', '2', '--steps', '5']) == 0; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torch_mlir') or m.startswith('iree.compiler')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    return bundle, table, done.stderr


@pytest.fixture(scope="module")
def example(model_file):
    namespace = {}
    exec(compile(MODEL, str(model_file), "exec"), namespace)
    inputs, target = namespace["example_batch"]()
    return namespace["model"], inputs, target


def test_the_table_names_the_device_and_holds_every_candidate(tuned):
    bundle, table_path, progress = tuned
    manifest = json.loads((bundle / "tune.json").read_text())
    table = json.loads(table_path.read_text())
    assert (table["format"], table["target"], table["device"], table["driver"]) == (
        TABLE_FORMAT,
        "host",
        cpu_device(),
        "local-task",
    )
    assert table["iree"] == {
        "compiler": iree_version("iree-base-compiler"),
        "runtime": iree_version("iree-base-runtime"),
    }
    # the model's one convolution: its forward and its weight's gradient (the input needs none), each form
    (case,) = table["convs"]["cases"]
    assert case["class"] == CONV
    assert sorted(case["ms"]) == ["forward/direct", "forward/im2col", "weight_grad/direct", "weight_grad/im2col"]
    assert sorted(case["ms"]) == sorted(c["key"] for c in manifest["convs"][0]["candidates"])
    assert "disagree_with_baseline" not in case
    steps = table["flags"]["step_ms"]["tiny_cnn.py"]
    assert sorted(steps) == sorted(SETS.split(","))
    for step in manifest["steps"]:
        # a Trainer of the step's bundle holds the device memory the table records for it
        trainer = Trainer.from_bundle(load_bundle(bundle / step["bundle"]))
        assert steps[step["set"]]["device_mb"] == trainer.device_bytes / 2**20
        assert 0 < steps[step["set"]]["step_ms_min"] <= steps[step["set"]]["step_ms_median"]
    assert table["flags"]["programs"]["tiny_cnn.py"] == manifest["program"]
    assert "timing 4 forms of dense 3x3/s1 3->4 6x6 n2" in progress  # progress on stderr


def test_each_step_candidate_is_the_program_under_its_flag_set(tuned):
    bundle, _, _ = tuned
    manifest = json.loads((bundle / "tune.json").read_text())
    flags = {step["set"]: step["iree_flags"] for step in manifest["steps"]}
    assert "--iree-global-opt-data-tiling" in flags["im2col+global-data-tiling"]
    assert "--iree-global-opt-data-tiling" not in flags["im2col"]


def _planted(table_path: Path, tmp_path: Path, plant) -> Path:
    table = json.loads(table_path.read_text())
    plant(table)
    path = tmp_path / "planted.json"
    path.write_text(json.dumps(table))
    return path


@pytest.mark.parametrize("faster", ["im2col", "direct"])
def test_a_choice_follows_a_planted_measurement(tuned, example, tmp_path, faster):
    _, table_path, _ = tuned
    slower = {"im2col": "direct", "direct": "im2col"}[faster]

    def plant(table):
        ms = table["convs"]["cases"][0]["ms"]
        ms[f"forward/{faster}"], ms[f"forward/{slower}"] = 0.0123, 0.5
        steps = table["flags"]["step_ms"]["tiny_cnn.py"]
        tiled = faster == "im2col"  # data-tiled planted twice as fast in one case, twice as slow in the other
        steps["im2col+global-data-tiling"]["step_ms_min"] = steps["im2col"]["step_ms_min"] * (0.5 if tiled else 2)

    model, inputs, target = example
    program = pock.compile_training(model(), inputs, target, tuning=_planted(table_path, tmp_path, plant), functions=())
    forward = program.backend.ops["train_step"][0]
    assert forward.op == f"convolution {CONV}"
    assert forward.choice.form == faster
    assert forward.choice.measured.case == CONV  # the model's own shape decided
    assert f"{faster} 0.012 ms" in forward.choice.reason and "planted.json" in forward.choice.reason
    assert program.data_tiling.form == ("data-tiled" if faster == "im2col" else "plain")
    assert program.data_tiling.measured.case == "tiny_cnn.py"
    report = program.backend_report().splitlines()
    assert report[-1].startswith("tuning: pock-tune table") and report[-1].endswith(
        "measured for this program (tiny_cnn.py)"
    )


def test_an_untuned_model_says_the_shipped_table_decided(example):
    model, inputs, target = example
    program = pock.compile_training(model(), inputs, target, functions=())
    assert (
        program.backend_report()
        .splitlines()[-1]
        .endswith("the bench's programs: each choice by the most alike shape or program")
    )


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("device", "CPU x86_64-Other-1-2", f"measured on CPU x86_64-Other-1-2, not this {cpu_device()}"),
        ("target", "aarch64", "measured for target 'aarch64', not 'host'"),
        ("iree", {"compiler": "3.12.0", "runtime": "3.12.0"}, "measured with IREE runtime 3.12.0, not this machine's"),
    ],
)
def test_a_table_from_elsewhere_is_refused_in_one_line(
    tuned, model_file, example, tmp_path, capsys, field, value, message
):
    _, table_path, _ = tuned
    foreign = _planted(table_path, tmp_path, lambda table: table.update({field: value}))
    argv = [str(model_file), "--tuning", str(foreign), "-o", str(tmp_path / "bundle")]
    assert pock_compile.main(argv) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert message in line and "--tuning-any" in line
    assert not (tmp_path / "bundle").exists()
    model, inputs, target = example
    with pytest.raises(ValueError, match="--tuning-any"):
        pock.compile_training(model(), inputs, target, tuning=foreign, functions=())
    used = pock.compile_training(model(), inputs, target, tuning=foreign, tuning_any=True, functions=())
    assert f"{message}" in used.backend_report().splitlines()[-1] and "(--tuning-any)" in used.backend_report()


def test_a_table_for_another_program_says_so(tuned):
    """The same CNN with 5 output channels is another program: the tiny CNN's table decides by
    its nearest measurements, and the report says so."""
    import torch
    from torch import nn

    _, table_path, _ = tuned
    model = nn.Sequential(nn.Conv2d(3, 5, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 6 * 6, 5))
    program = pock.compile_training(
        model, torch.randn(2, 3, 6, 6), torch.tensor([1, 3]), tuning=table_path, functions=()
    )
    assert (
        program.backend_report()
        .splitlines()[-1]
        .endswith("measured for tiny_cnn.py, not this program: the nearest of its measurements decide")
    )


def test_a_form_whose_results_disagree_is_never_in_the_table(model_file, tmp_path, monkeypatch):
    """A forward im2col form planted to compute twice the convolution (as a miscompiled one
    might): the run leaves it out and names it, so that no choice can take it."""
    from pock_mlir import tune
    from pock_mlir.runtime.tune import run

    im2col = tune.FORMS["forward", "im2col"]

    def doubled(b, shape, g, x, w):
        y = im2col(b, shape, g, x, w)
        return b.add(y, y)

    monkeypatch.setitem(tune.FORMS, ("forward", "im2col"), doubled)
    file = pock_compile.load_model_file(str(model_file))
    tune.prepare(file, "tiny_cnn.py", "host", tmp_path / "bundle", sets=("im2col",), log=lambda message: None)
    (case,) = run(tmp_path / "bundle", tmp_path / "t.json", repeats=1, steps=5, log=lambda m: None)["convs"]["cases"]
    assert case["disagree_with_baseline"] == ["forward/im2col"]
    assert sorted(case["ms"]) == ["forward/direct", "weight_grad/direct", "weight_grad/im2col"]


def test_concurrent_compilations_write_the_same_bundle(model_file, tmp_path):
    """prepare's jobs change how long it takes, not what it writes: every file byte for byte, the
    manifest but for the time it took."""
    from pock_mlir import tune

    file = pock_compile.load_model_file(str(model_file))
    lines = {}
    for jobs in (1, 2):
        lines[jobs] = []
        tune.prepare(
            file, "tiny_cnn.py", "host", tmp_path / str(jobs), sets=SETS.split(","), jobs=jobs, log=lines[jobs].append
        )

    def files(root):
        return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    one, two = files(tmp_path / "1"), files(tmp_path / "2")
    manifests = [json.loads(f.pop(Path("tune.json"))) for f in (one, two)]
    assert [m.pop("prepare_s") > 0 for m in manifests] == [True, True]
    assert manifests[0] == manifests[1] and one == two
    assert len(one) > 6  # four convolution modules and two step bundles
    # each candidate's progress line, in whichever order the threads started them
    assert len(lines[1]) == 2 + 4 + 2
    assert sorted(line.partition("] ")[2] for line in lines[1]) == sorted(line.partition("] ")[2] for line in lines[2])


def test_the_bench_can_hide_this_cpus_shipped_table(tmp_path):
    """bench/tune.py's default: the tables a CPU without a shipped table of its own reads."""
    from bench.tune import own_table_hidden
    from pock_mlir import tuning

    shipped, own = tuning.TUNING_DIR, tuning.own_table_path("host")
    with own_table_hidden(tmp_path):
        nearest = tuning.table_path("host")
        assert nearest.name != own.name and nearest.exists()
        assert tuning.Tuning.of_target("host").name.endswith(f"not this {tuning.host_cpu()})")
    assert tuning.TUNING_DIR == shipped and tuning.own_table_path("host") == own


def test_on_the_host_one_command_does_both(model_file, tmp_path, capsys):
    table_path = tmp_path / "both.json"
    argv = [str(model_file), "-o", str(table_path), "--sets", "im2col", "--repeats", "1", "--steps", "5"]
    assert pock_tune.main(argv) == 0
    table = json.loads(table_path.read_text())
    assert table["device"] == cpu_device() and list(table["flags"]["step_ms"]["tiny_cnn.py"]) == ["im2col"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["both.json"]  # its tuning bundle was temporary
    assert "timing the whole train_step under 1 flag sets" in capsys.readouterr().err


def test_bad_tuning_input_is_one_line(tuned, model_file, tmp_path, capsys):
    bundle, _, _ = tuned
    (tmp_path / "empty").mkdir()
    assert pock_tune.main(["run", str(tmp_path / "empty"), "-o", str(tmp_path / "t.json")]) == 1
    assert "is not a pock-tune bundle" in capsys.readouterr().err
    # a bundle for an aarch64 device is refused on this x86-64 machine before anything is timed
    aarch64 = tmp_path / "aarch64"
    aarch64.mkdir()
    manifest = json.loads((bundle / "tune.json").read_text())
    (aarch64 / "tune.json").write_text(json.dumps({**manifest, "target": "aarch64"}))
    assert pock_tune.main(["run", str(aarch64), "-o", str(tmp_path / "t.json")]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "needs an aarch64 CPU" in line and not (tmp_path / "t.json").exists()
    assert pock_tune.main(["prepare", str(model_file), "-o", str(tmp_path / "p"), "--sets", "im2col+ukernels"]) == 1
    assert "not among the sets chosen for host" in capsys.readouterr().err
    assert pock_tune.main(["prepare", str(model_file), "-o", str(tmp_path / "p"), "--jobs", "0"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--jobs 0: give the number of compilations" in line and not (tmp_path / "p").exists()
    assert pock_compile.main([str(model_file), "--tuning-any", "-o", str(tmp_path / "b")]) == 1
    assert "--tuning-any applies to a --tuning table" in capsys.readouterr().err


@pytest.mark.skipif(
    not LAVAPIPE, reason="lavapipe (Debian mesa-vulkan-drivers) is not installed; run tools/setup_device_deps.sh"
)
def test_a_vulkan_tuning_bundle_runs_on_lavapipe(model_file, tmp_path):
    """The mechanics on a GPU driver (lavapipe is a CPU: its timings say nothing of a GPU's)."""
    bundle, table_path = tmp_path / "vulkan", tmp_path / "vulkan.json"
    assert (
        pock_tune.main(["prepare", str(model_file), "--target", "vulkan", "-o", str(bundle), "--sets", "im2col"]) == 0
    )
    assert pock_tune.main(["run", str(bundle), "-o", str(table_path), "--repeats", "1", "--steps", "5"]) == 0
    table = json.loads(table_path.read_text())
    assert (table["target"], table["driver"]) == ("vulkan", "vulkan") and table["device"].startswith("GPU llvmpipe")
    assert sorted(table["convs"]["cases"][0]["ms"]) == [
        "forward/direct",
        "forward/im2col",
        "weight_grad/direct",
        "weight_grad/im2col",
    ]
    assert list(table["flags"]["step_ms"]["tiny_cnn.py"]) == ["im2col"]


def test_the_stock_benchmark_tool_times_the_same_candidates(tuned, tmp_path):
    """--benchmark-module (a device without Python): the same rows, the device as named, the
    forms marked unchecked, and each step's device memory as a Trainer of it holds (the Python
    run's table)."""
    import iree.runtime

    bundle, table_path, _ = tuned
    tool = Path(iree.runtime.__file__).parent.parent / "_runtime_libs" / "iree-benchmark-module"
    out = tmp_path / "stock.json"
    argv = ["run", str(bundle), "-o", str(out), "--benchmark-module", str(tool), "--device-name", "CPU named"]
    assert pock_tune.main([*argv, "--repeats", "2", "--steps", "5"]) == 0
    table, python = json.loads(out.read_text()), json.loads(table_path.read_text())
    assert table["device"] == "CPU named" and table["convs"]["cases"][0]["results_checked"] is False
    assert sorted(table["convs"]["cases"][0]["ms"]) == sorted(python["convs"]["cases"][0]["ms"])
    for flag_set, row in python["flags"]["step_ms"]["tiny_cnn.py"].items():
        assert table["flags"]["step_ms"]["tiny_cnn.py"][flag_set]["device_mb"] == row["device_mb"]


def test_the_stock_benchmark_tool_needs_the_device_named(tuned, tmp_path, capsys):
    bundle, _, _ = tuned
    assert pock_tune.main(["run", str(bundle), "-o", str(tmp_path / "t.json"), "--benchmark-module", "x"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "--benchmark-module and --device-name go together" in line


@pytest.mark.skipif(
    sys.platform != "linux"
    or not (shutil.which("qemu-aarch64") and AARCH64_BENCHMARK.exists() and AARCH64_SYSROOT.exists()),
    reason="needs qemu-aarch64, the aarch64 sysroot and IREE's aarch64 iree-benchmark-module: run tools/setup_device_deps.sh",
)
def test_an_aarch64_tuning_bundle_runs_under_qemu(model_file, example, tmp_path):
    """The mechanics under qemu-aarch64 (emulated timings choose nothing worth having)."""
    bundle, table_path = tmp_path / "aarch64", tmp_path / "aarch64.json"
    assert (
        pock_tune.main(["prepare", str(model_file), "--target", "aarch64", "-o", str(bundle), "--sets", "im2col"]) == 0
    )
    command = f"qemu-aarch64 -L {AARCH64_SYSROOT} {AARCH64_BENCHMARK}"
    argv = [
        "run",
        str(bundle),
        "-o",
        str(table_path),
        "--benchmark-module",
        command,
        "--device-name",
        "CPU qemu-aarch64",
    ]
    assert pock_tune.main([*argv, "--repeats", "1", "--steps", "5"]) == 0
    table = json.loads(table_path.read_text())
    assert (table["target"], table["device"]) == ("aarch64", "CPU qemu-aarch64")
    assert list(table["flags"]["step_ms"]["tiny_cnn.py"]) == ["im2col"]
    model, inputs, target = example
    program = pock.compile_training(model(), inputs, target, target="aarch64", tuning=table_path, functions=())
    assert program.backend_report().splitlines()[-1].endswith("measured for this program (tiny_cnn.py)")
    assert "CPU qemu-aarch64" in program.backend.ops["train_step"][0].choice.reason


def test_candidates_are_timed_in_interleaved_rounds():
    calls = []
    ms = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=4)
    assert calls == ["a", "b"] * (4 + WARMUP_CALLS) and set(ms) == {"a", "b"}


def test_the_guide_tunes_and_compiles_the_digits_mlp(tmp_path):
    """docs/tuning-for-your-device.md's block as written, in a scratch copy of the repository root."""
    import os

    from docs_blocks import REPO, doc_commands

    commands = doc_commands("docs/tuning-for-your-device.md", "## Tuning on the device")
    assert [c.split()[:2] for c in commands] == [
        ["pock-tune", "prepare"],
        ["pock-tune", "run"],
        ["pock-compile", "examples/mlp_digits.py"],
    ]
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    outputs = []
    for command in commands:
        done = subprocess.run(["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{command}\n{done.stderr[-2000:]}"
        outputs.append(done.stdout)
    table = json.loads((tmp_path / "table.json").read_text())
    assert table["model"] == "mlp_digits.py" and table["convs"]["cases"] == []  # an MLP: no convolutions
    assert sorted(table["flags"]["step_ms"]["mlp_digits.py"]) == ["im2col", "im2col+global-data-tiling"]
    assert outputs[-1].splitlines()[-2].endswith("measured for this program (mlp_digits.py)")
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["model"] == "mlp_digits.py"


def test_a_busy_machine_is_warned_of_and_recorded(tuned, tmp_path, monkeypatch):
    """busy_share from two planted /proc/stat snapshots (user nice system idle iowait irq softirq
    steal: 600 of 1000 ticks not idle), and a run on a machine that busy says so and records it."""
    from pock_mlir.runtime import timing, tune

    stat = tmp_path / "stat"
    snapshots = iter(["cpu  100 0 0 900 0 0 0 0 0 0\n", "cpu  650 0 50 1250 50 0 0 0 7 0\n"])
    stat.write_text(next(snapshots))
    monkeypatch.setattr(timing, "PROC_STAT", stat)
    with monkeypatch.context() as m:
        m.setattr(timing.time, "sleep", lambda seconds: stat.write_text(next(snapshots)))
        assert timing.busy_share() == pytest.approx(0.6)
    monkeypatch.setattr(timing, "PROC_STAT", tmp_path / "missing")
    assert timing.busy_share() is None  # not Linux: nothing to say

    logged = []
    monkeypatch.setattr(tune, "busy_share", lambda: 0.6)
    table = tune.run(tuned[0], tmp_path / "t.json", repeats=1, steps=5, log=logged.append)
    assert table["busy_before"] == 0.6
    assert logged[0].startswith("warning: other jobs keep 60% of this machine's CPU time busy")
