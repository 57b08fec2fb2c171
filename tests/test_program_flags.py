"""IREE's data tiling, vector tails and fusion, chosen per program by pock-backend-switch as the
flag study measured them on the most alike program of the tuning table: a step whose matmuls are
like a program whose fastest data-tiled step beat its fastest plain one is data-tiled, one like a
program that ran faster with masked vector tails (under the same data tiling) is masked, one like a
program that ran faster with aggressive fusion (under the same data tiling and vector tails) is
fused so, and each trains as torch.optim does; one like a program that did not (or failed to
compile) keeps the plain, peeled or default code, and one IREE fails to compile with the aggressive
fusion chosen compiles with the default. The tables here are written by the tests; the host's come
one per CPU (pock_mlir.tuning.table_path). The rules' cases are in
lit_tests/passes/pock-backend-switch.mlir."""

import dataclasses
import json
import math
import os
import sys
import warnings

import pytest
import torch
import torch.nn as nn
from oracle import assert_gradients_close, assert_trajectory_close, torch_gradients

import pock_mlir as pock
import pock_mlir.tuning as tuning
from pock_mlir.abi import TRAIN_STEP_INTO
from pock_mlir.iree_flags import (
    AGGRESSIVE_FUSION,
    AGGRESSIVE_FUSION_SET,
    BASELINE_SET,
    DATA_TILED_AGGRESSIVE_FUSION_SET,
    DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET,
    DATA_TILED_MASKED_TAILS_SET,
    DATA_TILING,
    DATA_TILING_SET,
    MASKED_AGGRESSIVE_FUSION_SET,
    MASKED_TAILS_SET,
    MASKED_VECTOR_TAILS,
    PEELED_VECTOR_TAILS,
)
from pock_mlir.runtime.artifact import trainer_module
from pock_mlir.stages import pipelines_with_switch
from pock_mlir.tuning import MatmulFlops, Measured

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from models.transformer import LlamaConfig, LlamaLike, token_cross_entropy  # noqa: E402

STEPS = 5
OPTIMIZER = pock.AdamW(lr=1e-3, weight_decay=0.01)
TAILS = "--iree-llvmcpu-vector-pproc-strategy="

# measured programs: fastest step ms under the flag sets (plain and peeled: 10 ms), and what the choices read of them
# (without attention, as the MLPs compiled here, which are to be like each of them by their matmuls)
MEASURED = {
    "transformer": (
        {DATA_TILING_SET: 7.3, DATA_TILED_MASKED_TAILS_SET: 7.4},
        MatmulFlops(convolutions=0, matmuls=56_000_000_000, largest_matmul=537_000_000, untiled_matmuls=0, softmaxes=0),
    ),
    # aggressive fusion slows its peeled step and speeds its masked one
    "mlp": (
        {DATA_TILING_SET: 11.1, MASKED_TAILS_SET: 8.5, AGGRESSIVE_FUSION_SET: 10.2, MASKED_AGGRESSIVE_FUSION_SET: 7.9},
        MatmulFlops(convolutions=0, matmuls=200_000_000, largest_matmul=34_000_000, untiled_matmuls=0, softmaxes=0),
    ),
    "vit": (
        {
            DATA_TILING_SET: 8.7,
            DATA_TILED_MASKED_TAILS_SET: 7.8,
            DATA_TILED_AGGRESSIVE_FUSION_SET: 8.0,
            DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET: 7.2,
        },
        MatmulFlops(
            convolutions=0, matmuls=1_000_000_000, largest_matmul=30_000_000, untiled_matmuls=900_000_000, softmaxes=0
        ),
    ),
}


def write_table(path, measured: dict, failed: dict | None = None):
    """A tuning table of a flag study, `measured` as MEASURED is (each baseline step 10 ms);
    `failed`: {program: the flag set that failed to compile it}."""
    path.write_text(
        json.dumps(
            {
                "flags": {
                    "step_ms": {
                        model: {
                            BASELINE_SET: {"step_ms_min": 10.0},
                            **{s: {"step_ms_min": ms} for s, ms in sets.items()},
                            **({failed[model]: {"error": "failed"}} if model in (failed or {}) else {}),
                        }
                        for model, (sets, _) in measured.items()
                    },
                    "programs": {model: dataclasses.asdict(flops) for model, (_, flops) in measured.items()},
                }
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A tuning table of MEASURED; a set that failed to compile a program counts as slower there."""
    return write_table(tmp_path_factory.mktemp("tuning") / "table.json", MEASURED, {"vit": AGGRESSIVE_FUSION_SET})


@pytest.fixture(scope="module")
def pipelines(table):
    """The compiler's pipelines with pock-backend-switch reading the table of MEASURED."""
    return pipelines_with_switch(f"tuning={table}")


def make_mlp(width: int):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, 10))


def make_batch(rows: int):
    g = torch.Generator().manual_seed(1)
    return torch.randn(rows, 256, generator=g), torch.randint(0, 10, (rows,), generator=g)


@pytest.fixture(scope="module")
def wide(pipelines):
    """Its first matmul is 2 x 1024 x 256 x 512 = 268 MFLOP: most like the transformer."""
    model, (x, y) = make_mlp(512), make_batch(1024)
    return (
        model,
        x,
        y,
        pock.compile_training(model, x, y, loss="cross_entropy", optimizer=OPTIMIZER, pipelines=pipelines),
    )


def test_a_step_like_a_program_faster_data_tiled_is_data_tiled(wide):
    *_, program = wide
    # the transformer's fastest data-tiled step against its fastest plain one
    tiling = program.data_tiling
    assert tiling.form == "data-tiled" and tiling.measured == Measured(
        "transformer", {DATA_TILING_SET: 7.3, BASELINE_SET: 10.0}
    ), tiling
    assert DATA_TILING in program.iree_flags()
    assert f"\nmatmuls: data-tiled ({tiling.reason})" in program.backend_report()
    # its vector tails follow the transformer's data-tiled measurements: masked was not faster there
    tails = program.vector_tails
    assert tails.form == "peeled" and tails.measured == Measured(
        "transformer", {DATA_TILED_MASKED_TAILS_SET: 7.4, DATA_TILING_SET: 7.3}
    ), tails
    assert [f for f in program.iree_flags() if f.startswith(TAILS)][-1] == PEELED_VECTOR_TAILS
    assert f"\nvector tails: peeled ({tails.reason})" in program.backend_report()
    # the choices travel typed from the pass, not in the IR text: without its stages' IR (as the
    # bench pickles a program) it compiles with the same flags
    assert dataclasses.replace(program, stages={}).iree_flags() == program.iree_flags()


def test_data_tiled_step_matches_autograd_and_torch_optim(wide):
    model, x, y, program = wide
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert_gradients_close(grads, want)
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(STEPS)]
    assert_trajectory_close(losses, trainer.state_dict(), model, x, y, OPTIMIZER, STEPS)


def test_a_step_like_a_program_slower_data_tiled_stays_plain_and_one_faster_masked_is_masked(pipelines):
    model, (x, y) = make_mlp(32), make_batch(8)
    program = pock.compile_training(model, x, y, loss="cross_entropy", optimizer=OPTIMIZER, pipelines=pipelines)
    # the mlp's fastest data-tiled step against its fastest plain one, masked and fused
    tiling = program.data_tiling
    assert tiling.form == "plain" and tiling.measured == Measured(
        "mlp", {DATA_TILING_SET: 11.1, MASKED_AGGRESSIVE_FUSION_SET: 7.9}
    ), tiling
    assert not any(flag.startswith(DATA_TILING) for flag in program.iree_flags())
    tails = program.vector_tails
    assert tails.form == "masked" and tails.measured == Measured("mlp", {MASKED_TAILS_SET: 8.5, BASELINE_SET: 10.0})
    flags = program.iree_flags()
    assert [f for f in flags if f.startswith(TAILS)][-1] == MASKED_VECTOR_TAILS
    # fused under its masked tails, though the peeled step was slower fused (10.2 ms against 10)
    fusion = program.fusion
    assert fusion.form == "aggressive" and fusion.measured == Measured(
        "mlp", {MASKED_AGGRESSIVE_FUSION_SET: 7.9, MASKED_TAILS_SET: 8.5}
    ), fusion
    assert AGGRESSIVE_FUSION in flags and f"\nfusion: aggressive ({fusion.reason})" in program.backend_report()
    # chosen before extra_flags, which win
    override = dataclasses.replace(program, extra_flags=(PEELED_VECTOR_TAILS,)).iree_flags()
    assert [f for f in override if f.startswith(TAILS)][-1] == PEELED_VECTOR_TAILS
    trainer = program.trainer()
    losses = [trainer.step(x, y) for _ in range(STEPS)]
    assert_trajectory_close(losses, trainer.state_dict(), model, x, y, OPTIMIZER, STEPS)


def test_a_step_of_untiled_rows_is_data_tiled_and_matches_autograd(pipelines, table):
    model, (x, y) = make_mlp(32), make_batch(260)
    program = pock.compile_training(
        model, x, y, loss="cross_entropy", optimizer=OPTIMIZER, functions=(), pipelines=pipelines
    )
    # like the vit, whose plain step failed to compile with aggressive fusion: its fastest plain one is the baseline
    tiling = program.data_tiling
    assert tiling.form == "data-tiled" and tiling.measured == Measured(
        "vit", {DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET: 7.2, BASELINE_SET: 10.0}
    ), tiling
    tails = program.vector_tails
    assert tails.form == "masked" and tails.measured == Measured(
        "vit", {DATA_TILED_MASKED_TAILS_SET: 7.8, DATA_TILING_SET: 8.7}
    ), tails
    fusion = program.fusion
    assert fusion.form == "aggressive" and fusion.measured == Measured(
        "vit", {DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET: 7.2, DATA_TILED_MASKED_TAILS_SET: 7.8}
    ), fusion
    assert AGGRESSIVE_FUSION in program.iree_flags()
    # plain, it would take the vit's measurement, where aggressive fusion failed to compile
    choice = tuning.choose_fusion(
        tuning.Tuning.from_file(str(table)), MEASURED["vit"][1], data_tiled=False, masked_tails=False
    )
    assert choice.form == "default" and choice.measured == Measured(
        "vit", {AGGRESSIVE_FUSION_SET: math.inf, BASELINE_SET: 10.0}
    ), choice
    loss, grads = program.trainer().gradients(x, y)
    want_loss, want = torch_gradients(model, x, y)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    assert_gradients_close(grads, want)


def test_a_program_far_smaller_than_the_step_data_tiling_was_measured_on_stays_plain(table):
    """Packing a matmul's operands is work of its own that only a large enough matmul repays: the
    vit's data-tiled measurement carries to a program like it down to a tenth of its largest matmul
    (MAX_DATA_TILING_SHRINK), not below; what the program is most alike to does not change."""
    measured = tuning.Tuning.from_file(str(table))
    vit = MEASURED["vit"][1]

    def tiling(largest_matmul: int):
        return tuning.choose_data_tiling(measured, dataclasses.replace(vit, largest_matmul=largest_matmul))

    at_a_tenth = tiling(vit.largest_matmul // tuning.MAX_DATA_TILING_SHRINK)
    assert at_a_tenth.form == "data-tiled" and at_a_tenth.measured.case == "vit", at_a_tenth
    below = tiling(vit.largest_matmul // tuning.MAX_DATA_TILING_SHRINK - 1)
    assert below.form == "plain" and below.measured == at_a_tenth.measured, below
    assert below.reason.startswith("its largest matmul (3.000 MFLOP) is more than 10x smaller than that of the step")
    assert below.reason.endswith(at_a_tenth.reason)


def test_a_small_step_far_smaller_than_the_one_fusion_was_measured_on_is_fused(table, tmp_path):
    """A small step is dispatch-bound: below a tenth of the largest matmul of the step fusion was
    measured on (MAX_DATA_TILING_SHRINK), a plain step without attention and under SMALL_FUSED_FLOPS
    of matmuls and convolutions is fused aggressively, where the mlp's peeled measurement (1.02x)
    would leave it the default; at the bound, with attention, data-tiled, or where IREE failed to
    compile the measured step fused, it is not."""
    measured = tuning.Tuning.from_file(str(table))
    mlp = MEASURED["mlp"][1]
    tenth = mlp.largest_matmul // tuning.MAX_DATA_TILING_SHRINK
    small = MatmulFlops(convolutions=0, matmuls=1_000_000, largest_matmul=tenth - 1, untiled_matmuls=0, softmaxes=0)

    def fusion(flops: MatmulFlops, data_tiled: bool = False):
        return tuning.choose_fusion(measured, flops, data_tiled=data_tiled, masked_tails=False)

    at_a_tenth = fusion(dataclasses.replace(small, largest_matmul=tenth))
    assert at_a_tenth.form == "default" and at_a_tenth.measured.case == "mlp", at_a_tenth
    below = fusion(small)
    assert below.form == "aggressive" and below.measured == at_a_tenth.measured, below
    assert below.reason.startswith(
        "its largest matmul (3.400 MFLOP) is more than 10x smaller than that of the step fusion was measured on, "
        "and it is a step without attention under 40 MFLOP of matmuls and convolutions (1.0); "
    )
    assert below.reason.endswith(at_a_tenth.reason)
    at_the_bound = fusion(dataclasses.replace(small, matmuls=tuning.SMALL_FUSED_FLOPS))
    assert at_the_bound.form == "default" and "it is not a step without attention" in at_the_bound.reason
    attention = fusion(dataclasses.replace(small, softmaxes=1))
    assert attention.form == "default" and "(1.0, with attention)" in attention.reason, attention
    tiled = fusion(small, data_tiled=True)  # as measured on the vit, the one step measured so
    assert tiled.measured.case == "vit" and not tiled.reason.startswith("its largest matmul"), tiled
    failed = tuning.Tuning.from_file(str(write_table(tmp_path / "t.json", MEASURED, {"mlp": AGGRESSIVE_FUSION_SET})))
    after_a_failure = tuning.choose_fusion(failed, small, data_tiled=False, masked_tails=False)
    assert after_a_failure.form == "default" and after_a_failure.reason.endswith(
        "failed to compile with aggressive fusion"
    )


def test_a_program_is_like_one_of_its_structure_before_one_of_its_matmul_sizes(tmp_path):
    """Under aggressive fusion IREE 3.13 failed to compile the attention steps of the flag studies
    (but the ViT's), not the MLPs': a small transformer's step takes the decoder's choice, though
    its matmuls are the MLP's size, and the same step without attention the MLP's; a tiny matmul
    the MLP's too, not the choice of a CNN whose one small matmul is its size."""
    sizes = dict(convolutions=0, matmuls=200_000_000, largest_matmul=34_000_000, untiled_matmuls=0)
    table = tuning.Tuning.from_file(
        str(
            write_table(
                tmp_path / "table.json",
                {
                    "mlp": ({AGGRESSIVE_FUSION_SET: 8.0}, MatmulFlops(**sizes, softmaxes=0)),
                    "decoder": ({}, MatmulFlops(**{**sizes, "largest_matmul": 268_000_000}, softmaxes=8)),
                    "cnn": (
                        {AGGRESSIVE_FUSION_SET: 11.0},
                        MatmulFlops(10**9, matmuls=400, largest_matmul=400, untiled_matmuls=0, softmaxes=0),
                    ),
                },
                {"decoder": AGGRESSIVE_FUSION_SET},
            )
        )
    )

    def fusion(**flops):
        return tuning.choose_fusion(table, MatmulFlops(**{**sizes, **flops}), data_tiled=False, masked_tails=False)

    with_attention = fusion(softmaxes=4)
    assert with_attention.form == "default" and with_attention.measured == Measured(
        "decoder", {AGGRESSIVE_FUSION_SET: math.inf, BASELINE_SET: 10.0}
    ), with_attention
    for without in (fusion(softmaxes=0), fusion(matmuls=400, largest_matmul=400, softmaxes=0)):
        assert without.form == "aggressive" and without.measured == Measured(
            "mlp", {AGGRESSIVE_FUSION_SET: 8.0, BASELINE_SET: 10.0}
        ), without


def test_fusion_measured_only_with_peeled_tails_is_not_taken_with_masked_ones(tmp_path):
    """A table of an older study measured aggressive fusion with peeled tails alone: a program
    masked keeps the default fusion, saying what to measure, where peeled it follows the study."""
    mlp = MEASURED["mlp"][1]
    table = tuning.Tuning.from_file(
        str(write_table(tmp_path / "table.json", {"mlp": ({MASKED_TAILS_SET: 8.5, AGGRESSIVE_FUSION_SET: 9.0}, mlp)}))
    )
    masked = tuning.choose_fusion(table, mlp, data_tiled=False, masked_tails=True)
    assert masked.form == "default" and masked.measured is None, masked
    assert masked.reason == (
        f"no aggressive-fusion measurements for {table.name} (python -m bench.iree_study flags "
        "--sets im2col+masked-tails,im2col+masked-tails+aggressive-fusion)"
    )
    peeled = tuning.choose_fusion(table, mlp, data_tiled=False, masked_tails=False)
    assert peeled.form == "aggressive" and peeled.measured == Measured(
        "mlp", {AGGRESSIVE_FUSION_SET: 9.0, BASELINE_SET: 10.0}
    ), peeled


def test_a_program_iree_fails_to_compile_with_the_aggressive_fusion_chosen_compiles_with_the_default(tmp_path):
    """IREE 3.13 fails on this decoder's step data-tiled with aggressive fusion (on x86-64-v3 and
    with AVX-512); the table chooses both for it. The program then compiles with the default
    fusion, says so, trains as torch.optim does, and the compile cache remembers the failure."""
    decoder = (
        {DATA_TILING_SET: 8.0, DATA_TILED_AGGRESSIVE_FUSION_SET: 6.0, DATA_TILED_MASKED_TAILS_SET: 9.0},
        MatmulFlops(convolutions=0, matmuls=10**6, largest_matmul=10**5, untiled_matmuls=0, softmaxes=2),
    )
    pipelines = pipelines_with_switch(f"tuning={write_table(tmp_path / 'table.json', {'decoder': decoder})}")
    torch.manual_seed(0)
    model = LlamaLike(LlamaConfig(vocab=64, max_len=8, dim=16, heads=2, kv_heads=1, layers=1, hidden=32))
    g = torch.Generator().manual_seed(1)
    ids, target = torch.randint(0, 64, (2, 8), generator=g), torch.randint(0, 64, (2, 8), generator=g)
    optimizer = pock.SGD(lr=0.1, momentum=0.9)

    def compile_it():
        with pytest.warns(
            UserWarning,
            match="IREE failed to compile train_step_into, loss, evaluate with the "
            r"aggressive fusion pock-backend-switch chose \(.+\); compiled with "
            r"IREE's default fusion instead \(program.fusion\)",
        ):
            return pock.compile_training(
                model, ids, target, loss=token_cross_entropy, optimizer=optimizer, target="x86-64", pipelines=pipelines
            )

    program = compile_it()
    assert program.data_tiling.form == "data-tiled", program.data_tiling
    # the choice the pass made, with what it measured, and why compiling replaced it
    fusion = program.fusion
    assert fusion.form == "default" and fusion.measured == Measured(
        "decoder", {DATA_TILED_AGGRESSIVE_FUSION_SET: 6.0, DATA_TILING_SET: 8.0}
    ), fusion
    assert program.backend.fusion.form == "aggressive"
    assert fusion.reason.startswith(
        f"{program.backend.fusion.reason}, but IREE failed to compile train_step_into, loss, evaluate with it: "
    ), fusion.reason
    flags = program.iree_flags()
    assert DATA_TILING in flags and not any(flag.startswith(AGGRESSIVE_FUSION) for flag in flags)
    assert f"\nfusion: default ({fusion.reason})" in program.backend_report()
    assert "iree (train_step_into, loss, evaluate): failed with aggressive fusion" in program.compile_report()
    trainer = program.trainer()
    losses = [trainer.step(ids, target) for _ in range(STEPS)]
    assert_trajectory_close(
        losses, trainer.state_dict(), model, ids, target, optimizer, STEPS, loss=token_cross_entropy
    )
    # compiled again, it goes straight to the default fusion: IREE compiles nothing
    again = compile_it()
    assert again.fusion == program.fusion
    iree = [phase for phase in again.timings if phase.startswith("iree")]
    assert iree and all(phase.endswith(("from the compile cache", "failed with aggressive fusion")) for phase in iree)
    # asked for by the caller, aggressive fusion stays, and IREE's failure is the error
    asked = dataclasses.replace(program, extra_flags=(AGGRESSIVE_FUSION,), modules={}, streams={}, replaced={})
    with pytest.raises(RuntimeError, match="IREE failed to compile the training program for target x86-64"):
        asked.module(trainer_module(TRAIN_STEP_INTO))


def test_a_program_iree_fails_to_compile_with_either_fusion_fails_with_iree_error_alone(
    pipelines, tmp_path, monkeypatch
):
    """Where IREE fails under the default fusion too (here a flag it does not know; for a user, an op
    it cannot lower), that is the error: no warning that the aggressive fusion chosen was replaced,
    and no fusion failure remembered."""
    monkeypatch.setenv("POCK_MLIR_CACHE_DIR", str(tmp_path / "cache"))
    model, (x, y) = make_mlp(32), make_batch(8)
    program = pock.compile_training(
        model,
        x,
        y,
        loss="cross_entropy",
        optimizer=OPTIMIZER,
        functions=(),
        pipelines=pipelines,
        iree_flags=("--iree-no-such-flag",),
    )
    assert program.fusion.form == "aggressive", program.fusion  # like the table's mlp
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(
            RuntimeError, match="(?s)IREE failed to compile the training program for target host:.*iree-no-such-flag"
        ):
            program.module(trainer_module(TRAIN_STEP_INTO))
    assert not [w for w in caught if "fusion" in str(w.message)], [str(w.message) for w in caught]
    assert program.fusion.form == "aggressive" and not list((tmp_path / "cache").rglob("*.failed.json"))


@pytest.mark.parametrize(
    "cpu, chosen",
    [
        ("x86_64-GenuineIntel-6-207", "host-x86_64-GenuineIntel-6-207.json"),  # its own
        ("x86_64-GenuineIntel-6-143", "host-x86_64-GenuineIntel-6-207.json"),  # the same vendor and family
        ("x86_64-AuthenticAMD-25-17", "host-x86_64-AuthenticAMD.json"),
        ("x86_64-CentaurHauls-7-59", "host-x86_64-AuthenticAMD.json"),  # the same architecture: the first table
        ("aarch64-0x41-0xd08", None),  # none measured on ARM: none
    ],
)
def test_the_host_table_is_the_one_measured_on_the_most_alike_cpu(tmp_path, monkeypatch, cpu, chosen):
    for name in ("host-x86_64-AuthenticAMD.json", "host-x86_64-GenuineIntel-6-207.json", "x86-64-v3.json"):
        (tmp_path / name).write_text("{}")
    monkeypatch.setattr(tuning, "TUNING_DIR", tmp_path)
    monkeypatch.setattr(tuning, "host_cpu", lambda: cpu)
    path = tuning.table_path("host")
    assert path == tmp_path / (chosen or f"host-{cpu}.json") and path.exists() == bool(chosen)
    name = tuning.Tuning.of_target("host").name
    assert name == (
        f"target 'host' (CPU {cpu})"
        if chosen in (None, f"host-{cpu}.json")
        else f"target 'host' (CPU {chosen[5:-5]}, not this {cpu})"
    )
    assert tuning.table_path("x86-64-v3") == tmp_path / "x86-64-v3.json"


@pytest.mark.parametrize(
    "cpu, chosen",
    [
        ("x86_64-GenuineIntel-6-207", "host-x86_64-AuthenticAMD-25-17.json"),  # never its own: the first alike
        ("x86_64-AuthenticAMD-26-2", "host-x86_64-AuthenticAMD-25-17.json"),  # the same vendor
        ("aarch64-0x41-0xd08", None),
    ],
)
def test_another_cpus_table_is_the_most_alike_but_its_own(tmp_path, monkeypatch, cpu, chosen):
    """What a CPU without a table of its own would get (python -m bench.held_out --as-unmeasured-cpu)."""
    for name in ("host-x86_64-AuthenticAMD.json", "host-x86_64-AuthenticAMD-25-17.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / f"host-{cpu}.json").write_text("{}")
    monkeypatch.setattr(tuning, "TUNING_DIR", tmp_path)
    monkeypatch.setattr(tuning, "host_cpu", lambda: cpu)
    assert tuning.table_path("host") == tmp_path / f"host-{cpu}.json"
    assert tuning.table_path("host", others_only=True) == (chosen and tmp_path / chosen)


# a program as studies wrote it before they counted softmaxes
OLDER_PROGRAM = (
    '{"flags": {"programs": {"mlp": {"convolutions": 0, "matmuls": 1, "largest_matmul": 1, "untiled_matmuls": 0}}}}'
)


@pytest.mark.parametrize(
    "text", ["[]", '{"flags": {"programs": {"mlp": {"flops": 1}}}}', '{"convs": {"cases": [{}]}}', OLDER_PROGRAM]
)
def test_a_malformed_tuning_file_is_one_clear_error(tmp_path, text):
    path = tmp_path / "table.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"tuning table '{path}' is not one python -m bench.iree_study writes"):
        tuning.Tuning.from_file(str(path))


def test_a_host_table_an_older_study_wrote_is_one_clear_error_of_the_pass(tmp_path, monkeypatch):
    (tmp_path / "host-x86_64-AuthenticAMD-25-17.json").write_text(OLDER_PROGRAM)
    monkeypatch.setattr(tuning, "TUNING_DIR", tmp_path)
    monkeypatch.setattr(tuning, "host_cpu", lambda: "x86_64-AuthenticAMD-25-17")
    model, (x, y) = make_mlp(32), make_batch(8)
    with pytest.raises(
        pock.CompileError,
        match=r"missing 1 required positional argument: 'softmaxes'\): measure it "
        r"again",
    ) as error:
        pock.compile_training(model, x, y, loss="cross_entropy", optimizer=OPTIMIZER, functions=(), cache=False)
    assert "internal error" not in str(error.value) and "Traceback" not in str(error.value)


def taken(flagged: dict, base: dict) -> bool:
    """The rule, from the table's numbers: at least 5% faster, or no slower in at least 5% less of a
    Trainer's device memory (where the study recorded it); a set that failed to compile is not."""
    if "step_ms_min" not in flagged:
        return False
    time = flagged["step_ms_min"] / base["step_ms_min"]
    memory = flagged["device_mb"] / base["device_mb"] if "device_mb" in flagged and "device_mb" in base else math.inf
    return time <= 0.95 or (time <= 1 and memory <= 0.95)


def fastest(sets: dict, names: tuple[str, ...]) -> str:
    """The set of `names` the study timed fastest."""
    return min((name for name in names if "step_ms_min" in sets.get(name, {})), key=lambda n: sets[n]["step_ms_min"])


@pytest.mark.parametrize("path", sorted(tuning.TUNING_DIR.glob("host-*.json")), ids=lambda p: p.stem)
def test_each_shipped_host_table_decides_every_program_it_measured(path):
    """Each measured program has what the data-tiling choice reads (a table without it would choose
    plain everywhere, 'no data-tiling measurements'), and is its own most alike program: data-tiled
    where its fastest data-tiled step beats its fastest plain one; so for the vector tails and for
    aggressive fusion, under its data tiling (and vector tails), where the table measured them."""
    table = tuning.Tuning.from_file(str(path))
    study = table.table["flags"]
    assert study["step_ms"] and set(study["programs"]) == set(study["step_ms"])
    for model, sets in study["step_ms"].items():
        flops = MatmulFlops(**study["programs"][model])
        tiled_set, plain_set = fastest(sets, tuning.DATA_TILED_SETS), fastest(sets, tuning.PLAIN_SETS)
        choice = tuning.choose_data_tiling(table, flops)
        compared = (tiled_set, plain_set)
        memory = {s: sets[s]["device_mb"] for s in compared} if all("device_mb" in sets[s] for s in compared) else {}
        assert choice.measured == Measured(model, {s: sets[s]["step_ms_min"] for s in compared}, memory), choice
        assert choice.form == ("data-tiled" if taken(sets[tiled_set], sets[plain_set]) else "plain")
        tiled = choice.form == "data-tiled"
        masked, peeled = (DATA_TILED_MASKED_TAILS_SET, DATA_TILING_SET) if tiled else (MASKED_TAILS_SET, BASELINE_SET)
        if masked in sets:
            choice = tuning.choose_vector_tails(table, flops, data_tiled=tiled)
            assert choice.measured.case == model and choice.measured.ms == {
                masked: sets[masked]["step_ms_min"],
                peeled: sets[peeled]["step_ms_min"],
            }, choice
            assert choice.form == ("masked" if taken(sets[masked], sets[peeled]) else "peeled")
        masked_tails = masked in sets and taken(sets[masked], sets[peeled])
        fusion, unfused = {
            (False, False): (AGGRESSIVE_FUSION_SET, BASELINE_SET),
            (False, True): (MASKED_AGGRESSIVE_FUSION_SET, MASKED_TAILS_SET),
            (True, False): (DATA_TILED_AGGRESSIVE_FUSION_SET, DATA_TILING_SET),
            (True, True): (DATA_TILED_MASKED_AGGRESSIVE_FUSION_SET, DATA_TILED_MASKED_TAILS_SET),
        }[tiled, masked_tails]
        choice = tuning.choose_fusion(table, flops, data_tiled=tiled, masked_tails=masked_tails)
        if fusion in sets:
            assert choice.measured.case == model and choice.measured.ms == {
                fusion: sets[fusion].get("step_ms_min", math.inf),
                unfused: sets[unfused]["step_ms_min"],
            }, choice
            assert choice.form == ("aggressive" if taken(sets[fusion], sets[unfused]) else "default")
        elif not any(fusion in measured for measured in study["step_ms"].values()):
            assert choice.form == "default" and choice.reason.startswith("no aggressive-fusion measurements"), choice
    assert table.table["convs"]["cases"]


def test_this_machine_has_a_cpu_name():
    cpu = tuning.host_cpu()
    assert cpu.split("-")[0] in ("x86_64", "aarch64", "arm64") and " " not in cpu
