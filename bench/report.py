"""Ratios, the Markdown table docs/benchmarks.md shows, the target check and the bar chart."""

from __future__ import annotations

from pathlib import Path

from bench.models import MODELS, SCHEMES
from pock_mlir.files import atomic_save, atomic_write
from pock_mlir.iree_flags import AGGRESSIVE_FUSION, DATA_TILING, MASKED_VECTOR_TAILS

SYSTEM_TITLES = {
    "eager": "PyTorch eager",
    "torch.compile": "torch.compile",
    "ort-training": "ONNX Runtime training",
    "jax": "JAX jit",
    "executorch": "ExecuTorch training",
    "pock-mlir": "pock-mlir",
    "pock-mlir-deployed": "pock-mlir, deployed bundle (no torch)",
    "pock-mlir-full-beside": "pock-mlir, its full step timed in these rounds",
    "pock-mlir-deployed-ort-optimizer": "pock-mlir, deployed bundle, ONNX Runtime's optimizer (plain SGD)",
    "pock-mlir-no-reorder": "pock-mlir, no reorder-updates",
    "pock-mlir-no-param-order": "pock-mlir, no order-param-reads (parameters in two sets)",
    "pock-mlir-no-retain": "pock-mlir, freed memory not retained",
    "pock-mlir-other-tails": "pock-mlir, the other vector tails (masked where peeled was chosen, and the reverse)",
    "pock-mlir-no-factor-reductions": "pock-mlir, no factor-reductions (each batch norm's backward sums four times)",
    "pock-mlir-no-per-image": "pock-mlir, no per-image form (1x1 convolutions as im2col or direct)",
    "pock-mlir-no-flipped": "pock-mlir, no flipped form (stride-1 input gradients as im2col or direct)",
    "ort-training-onnx": "ONNX Runtime training, the .onnx file",
    "pock-mlir-onnx": "pock-mlir, the .onnx file (from_ort_recipe, deployed bundle)",
}
# The ONNX file's rows (bench.__main__.measure): ONNX Runtime's and pock-mlir's training of one .onnx
# file, compared with each other only, in their own table.
ONNX_FILE_SYSTEMS = ("ort-training-onnx", "pock-mlir-onnx")
CNNS_AND_TRANSFORMERS = ("mobilenetv2", "resnet18", "bert", "llama")
SPARSE_VS_EAGER_4X = ("mobilenetv2", "bert")
PEERS = ("eager", "torch.compile", "ort-training", "jax", "executorch")  # the systems an edge user would otherwise pick


def _find(rows, model, scheme, system):
    return next(
        (r for r in rows if (r["model"], r["scheme"], r["system"]) == (model, scheme, system) and r["status"] == "ok"),
        None,
    )


def add_ratios(rows: list[dict], models: dict, peak_gflops: float | None) -> list[dict]:
    """Speed-ups against PyTorch eager full BP and against the same system's full BP, memory
    against eager full BP, achieved GFLOP/s (the FLOPs PyTorch's autograd step performs, from
    bench/flops.py, over the step time) and tokens/s. The ONNX file's rows take none: their table
    compares them with each other."""
    for row in rows:
        if row["status"] != "ok" or row["system"] in ONNX_FILE_SYSTEMS:
            continue
        eager_full = _find(rows, row["model"], "full", "eager")
        same_full = _find(rows, row["model"], "full", row["system"])
        counted = _find(rows, row["model"], row["scheme"], "eager")
        if eager_full:
            row["speedup_vs_eager_full"] = eager_full["step_ms"] / row["step_ms"]
            row["memory_vs_eager_full"] = row["peak_mb"] / eager_full["peak_mb"] if eager_full["peak_mb"] > 0 else None
        if same_full and row["scheme"] != "full":
            row["speedup_vs_own_full"] = same_full["step_ms"] / row["step_ms"]
        if counted and counted.get("flops"):
            row["gflops"] = counted["flops"] / 1e9 / (row["step_ms"] / 1e3)
            if peak_gflops:
                row["percent_of_sgemm_peak"] = 100 * row["gflops"] / peak_gflops
        tokens = models[row["model"]].tokens_per_step
        if tokens:
            row["tokens_per_s"] = tokens / (row["step_ms"] / 1e3)
    return rows


def check_targets(rows: list[dict], peak_gflops: float | None) -> list[tuple[str, bool | None, str, str, str]]:
    """(target, reached or None when unmeasured, the ratio of medians, the ratio of fastest steps,
    the GFLOP/s it takes) for the issue's targets; memory targets have only the first three.

    The GFLOP/s it takes is the rate at which the faster system would have to do its step's FLOPs
    to reach the target against the slower system's median: above the sgemm peak, only doing less
    work reaches it."""
    checks = []
    for model in dict.fromkeys(r["model"] for r in rows):
        eager_full = _find(rows, model, "full", "eager")
        pock_full = _find(rows, model, "full", "pock-mlir")
        pock_sparse = _find(rows, model, "sparse", "pock-mlir")

        def speedup(target, slow, fast, threshold):
            if not (slow and fast):
                checks.append((target, None, "not measured", "", ""))
                return
            value = slow["step_ms"] / fast["step_ms"]
            fastest = f"{slow['step_ms_min'] / fast['step_ms_min']:.2f}x"
            rate = _rate_it_takes(fast, value / threshold, peak_gflops)
            checks.append((target, value >= threshold, f"{value:.2f}x", fastest, rate))

        speedup(f"{model}: pock-mlir full BP faster than PyTorch eager full BP", eager_full, pock_full, 1.0)
        peers = [row for row in (_find(rows, model, "full", system) for system in PEERS) if row]
        if peers:
            fastest = min(peers, key=lambda row: row["step_ms"])
            speedup(
                f"{model}: pock-mlir full BP faster than the fastest peer ({SYSTEM_TITLES[fastest['system']]})",
                fastest,
                pock_full,
                1.0,
            )
        if pock_sparse:
            speedup(f"{model}: pock-mlir sparse BP at least as fast as its full BP", pock_full, pock_sparse, 1.0)
        if model in CNNS_AND_TRANSFORMERS:
            speedup(f"{model}: pock-mlir sparse BP >= 2x faster than pock-mlir full BP", pock_full, pock_sparse, 2.0)
        if model in SPARSE_VS_EAGER_4X:
            speedup(
                f"{model}: pock-mlir sparse BP >= 4x faster than PyTorch eager full BP", eager_full, pock_sparse, 4.0
            )
        limit = MODELS[model].compile_target_s if model in MODELS else None
        if limit:
            target = f"{model}: pock-mlir full BP compiles in <= {limit:.0f} s"
            seconds = (pock_full or {}).get("compile_s")
            checks.append(
                (target, None, "not measured", "", "")
                if seconds is None
                else (target, seconds <= limit, f"{seconds:.1f} s", "", "")
            )
        for scheme in ("full", "sparse"):
            ort, deployed = _find(rows, model, scheme, "ort-training"), _find(rows, model, scheme, "pock-mlir-deployed")
            same_training = _find(rows, model, scheme, "pock-mlir-deployed-ort-optimizer")
            if ort and deployed:
                target = f"{model}: pock-mlir's deployed trainer ({scheme}) below ONNX Runtime's peak memory"
                value = deployed["peak_mb"] / ort["peak_mb"]
                state = deployed.get("optimizer_state_mb")
                if ort.get("optimizer_differs") and same_training:  # judged on the same training
                    target += (
                        f", both with ONNX Runtime's plain SGD (with the model's momentum SGD, "
                        f"{state or 0:.1f} MB of state ONNX Runtime does not hold: {value:.2f}x)"
                    )
                    value = same_training["peak_mb"] / ort["peak_mb"]
                elif ort.get("optimizer_differs") and state:
                    target += (
                        f" (ONNX Runtime's plain SGD holds no optimizer state; pock-mlir's momentum is {state:.1f} MB)"
                    )
                checks.append((target, value < 1.0, f"{value:.2f}x", "", ""))
        target = f"{model}: pock-mlir sparse peak memory <= 0.5x PyTorch eager full BP"
        if eager_full and pock_sparse:
            value = pock_sparse["peak_mb"] / eager_full["peak_mb"]
            checks.append((target, value <= 0.5, f"{value:.2f}x", "", ""))
        else:
            checks.append((target, None, "not measured", "", ""))
    return checks


def _rate_it_takes(fast: dict, reached_fraction: float, peak_gflops: float | None) -> str:
    """The rate that reaches the target, as "<GFLOP/s> (<% of peak>; now <GFLOP/s>)", when FLOPs were counted."""
    if not fast.get("gflops"):
        return ""
    needed = fast["gflops"] / reached_fraction
    share = f"{100 * needed / peak_gflops:.0f}% of peak; " if peak_gflops else ""
    return f"{needed:.0f} ({share}now {fast['gflops']:.0f})"


def _fmt(value, pattern="{:.2f}", missing=""):
    return missing if value is None else pattern.format(value)


def _chosen_per_program(rows) -> str:
    """Which pock-mlir steps pock-backend-switch gave IREE's data tiling, masked vector tails and
    aggressive fusion (flags chosen per program)."""
    chosen = []
    for flag in (DATA_TILING, MASKED_VECTOR_TAILS, AGGRESSIVE_FUSION):
        programs = sorted(
            {
                f"{r['model']} {r['scheme']}"
                for r in rows
                if r["system"] == "pock-mlir" and r.get("status") == "ok" and flag in r.get("iree_flags", [])
            }
        )
        chosen += [f"`{flag}` (chosen per program) for {', '.join(programs)}"] if programs else []
    return "".join(f", and {c}" for c in chosen)


def _ort_note(rows) -> str:
    """How the ONNX Runtime rows were made and where they differ from the others, when there are any."""
    ort = [r for r in rows if r["system"] == "ort-training" and r["status"] == "ok"]
    if not ort:
        return ""
    plain_sgd = sorted({r["model"] for r in ort if r.get("optimizer_differs")})
    optimizer = (
        f" Its on-device training has no momentum SGD: its {', '.join(plain_sgd)} rows take plain SGD, "
        "so their loss differs from the others'."
        if plain_sgd
        else ""
    )
    return (
        f" ONNX Runtime training (onnxruntime {ort[0]['onnxruntime']}): the model and its loss exported by torch's "
        "TorchScript ONNX exporter, training artifacts from onnxruntime.training.artifacts (its compile s), timed "
        "in a process that never imports torch, so its peak memory is over the resident set after importing numpy "
        f"and onnxruntime.{optimizer}"
    )


def _jax_note(rows) -> str:
    """How the JAX rows were made, when there are any."""
    jax = [r for r in rows if r["system"] == "jax" and r["status"] == "ok"]
    if not jax:
        return ""
    return (
        f" JAX (jax {jax[0]['jax']}, {jax[0]['jax_device']}), on the LLaMA-like decoders only: a port of the model "
        "(bench/jax_child.py) with the PyTorch model's weights, its step one jax.jit function (loss, gradients of "
        "the trained parameters, torch.optim's update) with the trained parameters and optimizer state donated; "
        "its compile s is the first step's; timed in a process that never imports torch."
    )


def _executorch_note(rows) -> str:
    """How the ExecuTorch rows were made and where they differ from the others, when there are any."""
    executorch = [r for r in rows if r["system"] == "executorch" and r["status"] == "ok"]
    if not executorch:
        return ""
    plain_sgd = sorted({r["model"] for r in executorch if r.get("optimizer_differs")})
    optimizer = (
        f" Its training has SGD only: its {', '.join(plain_sgd)} rows take SGD at their AdamW's learning rate, "
        "so their loss differs from the others'."
        if plain_sgd
        else ""
    )
    return (
        f" ExecuTorch training (executorch {executorch[0]['executorch']}): the model and its loss by torch.export, "
        "its forward and backward by _export_forward_backward, lowered by to_edge and to_executorch to its "
        "portable and optimized kernels (its compile s), trained by its C++ SGD in a process of its own "
        "(bench/executorch_child.py) once its warm-up losses equal eager PyTorch's on the same training; its "
        "runtime imports torch, so its peak memory is over the resident set after importing torch and "
        f"executorch.{optimizer}"
    )


def _deployed_note(rows) -> str:
    """How the deployed pock-mlir rows were made, when there are any."""
    if not any(r["system"] == "pock-mlir-deployed" and r["status"] == "ok" for r in rows):
        return ""
    same_training = sorted({r["model"] for r in rows if r["system"] == "pock-mlir-deployed-ort-optimizer"})
    return (
        " pock-mlir, deployed bundle: the pock-mlir row's program written as a device bundle and trained by "
        "Trainer.from_bundle in a process that never imports torch (bench/deployed_child.py), as on a device; its "
        "peak memory is over the resident set after importing numpy, IREE's runtime and pock_mlir.runtime."
        + (
            f" On {', '.join(same_training)}, whose momentum SGD ONNX Runtime runs as plain SGD, a second deployed row "
            "is compiled with plain SGD too (ONNX Runtime's optimizer), for its memory against ONNX Runtime's on the "
            "same training."
            if same_training
            else ""
        )
    )


ROLE_NAMES = {"params": "parameters", "optimizer": "optimizer state", "buffers": "buffers"}


def _in_place_note(rows) -> str:
    """Which pock-mlir steps write what they update where they read it (pock_mlir/in_place.py)."""
    pock = [r for r in rows if r["status"] == "ok" and "in_place" in r]
    if not pock:
        return ""
    short = [
        f"{r['model']} {r['scheme']} ({SYSTEM_TITLES.get(r['system'], r['system'])}: only "
        f"{' and '.join(ROLE_NAMES[role] for role in r['in_place']) or 'nothing'} in place)"
        for r in pock
        if r["in_place"] != r["written"]
    ]
    return (
        " In place: every pock-mlir step "
        + (f"but {'; '.join(short)} " if short else "")
        + "writes the parameters, optimizer state and buffers it updates into the buffers it reads them from "
        "(Trainer.in_place, after IREE's schedule: pock_mlir/in_place.py), one copy of each on the device."
    )


def _updates_note(results: dict) -> str:
    """The models `python -m bench --update` re-measured since, and when."""
    return "".join(
        f" Re-measured with --update at {u['date']}: {', '.join(u['models'])}"
        f"{'' if len(u['schemes']) == len(SCHEMES) else ' (' + ', '.join(u['schemes']) + ')'} (load "
        f"{u['load_before'][0]:.2f} before, {u['load_after'][0]:.2f} after)."
        for u in results.get("updates", [])
    )


def _recount_note(results: dict) -> str:
    """When `python -m bench --recount-flops` counted the FLOPs again, if it did."""
    return f"; counted again at {results['flops_counted']}" if "flops_counted" in results else ""


def _idle_note(settings: dict) -> str:
    return (
        (
            ", once no thread of the system before it runs: ONNX Runtime's and OpenMP's thread pools spin on after "
            "their work"
        )
        if settings.get("rounds_start_idle")
        else ""
    )


def write_markdown(results: dict, path: Path) -> None:
    m, s = results["machine"], results["settings"]
    load = f"{m['load_before'][0]:.2f} before, {m['load_after'][0]:.2f} after (1-minute load average)"
    lines = [
        "# pock-mlir training-step benchmark",
        "",
        f"{results['date']} on {m['cpu']} ({m['cores']} cores; every system uses {m['threads']} threads). "
        f"Machine load: {load}.{_updates_note(results)}",
        f"Step time: median of {s['steps']} steps after {s['warmup']} warm-up steps, one fixed batch; of "
        f"{s.get('rounds', 1)} such rounds the one with the lowest median counts. The systems of one model and "
        "scheme are loaded side by side, each in its own process, and train in turns, round by round (each round "
        f"after one untimed step{_idle_note(s)}), so that other jobs on this shared machine disturb them alike; the "
        "fastest step shows "
        "what they disturbed least. Compile time "
        "is separate (pock-mlir's: compile_training until the Trainer's step module is built, the module a first "
        "step needs). Peak memory: the child process's peak resident set during the timed steps minus its resident "
        "set after the shared imports (torch, numpy, IREE runtime, pock_mlir); each system runs in its own process. "
        "pock-mlir's Trainer keeps the memory a step frees mapped (pock_mlir/runtime/memory.py); PyTorch runs with "
        f"glibc's defaults.{_ort_note(results['rows'])}{_jax_note(results['rows'])}"
        f"{_executorch_note(results['rows'])}{_deployed_note(results['rows'])}"
        f"{_in_place_note(results['rows'])} "
        "Trained values: the parameter elements the scheme updates (pock-mlir counts a channel-sparse tensor's "
        "trained rows; PyTorch and ONNX Runtime update such a tensor whole). Loss: the last step's. GFLOP/s: the "
        "FLOPs of PyTorch's autograd step (FlopCounterMode, a grouped convolution's backward counted per group: "
        f"bench/flops.py{_recount_note(results)}) over the step time; measured sgemm peak {_fmt(m.get('peak_gflops'), '{:.0f}')} GFLOP/s "
        f"(torch {_fmt(m.get('sgemm_gflops', {}).get('torch'), '{:.0f}')}, "
        f"numpy {_fmt(m.get('sgemm_gflops', {}).get('numpy'), '{:.0f}')}).",
        f"pock-mlir IREE flags: `{' '.join(s['pock_iree_flags'])}`{_chosen_per_program(results['rows'])}.",
    ]
    rows = [r for r in results["rows"] if r["system"] not in ONNX_FILE_SYSTEMS]
    if rows:
        lines += _main_table(rows, s["models"]) + _targets_section(rows, m.get("peak_gflops"))
    lines += onnx_file_section(results["rows"], s["models"])
    lines += profile_section(results["rows"])
    atomic_write(path, "\n".join(lines) + "\n")


def _main_table(rows: list[dict], titles: dict) -> list[str]:
    lines = [
        "",
        "| model | scheme | system | trained values | step ms | fastest step ms | speed-up vs eager full | vs own full | "
        "peak MB | memory vs eager full | loss | GFLOP/s (% peak) | tokens/s | compile s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        model = titles.get(r["model"], r["model"])
        system = SYSTEM_TITLES.get(r["system"], r["system"])
        scheme = r["scheme"] if r["scheme"] == "full" else f"{r['scheme']} ({r.get('scheme_used', '?')})"
        if r["status"] != "ok":
            lines.append(f"| {model} | {scheme} | {system} |  | {r['status']} |  |  |  |  |  |  |  |  |  |")
            continue
        gflops = f"{r['gflops']:.1f} ({r.get('percent_of_sgemm_peak', 0):.0f}%)" if r.get("gflops") else ""
        lines.append(
            f"| {model} | {scheme} | {system} | {_fmt(r.get('trainable_params'), '{:,}')} | {r['step_ms']:.2f} | "
            f"{r['step_ms_min']:.2f} | "
            f"{_fmt(r.get('speedup_vs_eager_full'), '{:.2f}x')} | "
            f"{_fmt(r.get('speedup_vs_own_full'), '{:.2f}x')} | {r['peak_mb']:.1f} | "
            f"{_fmt(r.get('memory_vs_eager_full'), '{:.2f}x')} | {r['loss']:.4f} | {gflops} | "
            f"{_fmt(r.get('tokens_per_s'), '{:.0f}')} | {_fmt(r.get('compile_s'), '{:.1f}')} |"
        )
    return lines


def _targets_section(rows: list[dict], peak_gflops: float | None) -> list[str]:
    lines = [
        "",
        "## Targets",
        "",
        "Reached is judged on the medians. The ratio of fastest steps is what the systems do when other jobs "
        "leave the cores alone: PyTorch's OpenMP threads spin-wait for each other, and a core taken by "
        "another process stalls them far more than IREE's task workers, so on a loaded machine its medians "
        "inflate most. GFLOP/s it takes: the rate at which pock-mlir would have to do its step's FLOPs "
        "(PyTorch's count) to reach the target against the other step's median; a rate above the sgemm "
        "peak means that no schedule of the same work reaches the target.",
        "",
        "| target | reached | ratio of medians | ratio of fastest steps | GFLOP/s it takes |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for target, ok, value, fastest, rate in check_targets(rows, peak_gflops):
        lines.append(f"| {target} | {'yes' if ok else 'no' if ok is False else '-'} | {value} | {fastest} | {rate} |")
    return lines


def onnx_file_section(rows: list[dict], titles: dict) -> list[str]:
    """The ONNX file's rows: ONNX Runtime's and pock-mlir's training of one .onnx file, side by side."""
    ort, pock = ONNX_FILE_SYSTEMS
    pairs = {}
    for r in rows:
        if r["system"] in ONNX_FILE_SYSTEMS:
            pairs.setdefault((r["model"], r["scheme"]), {})[r["system"]] = r
    if not pairs:
        return []
    measured = [r for pair in pairs.values() for r in pair.values() if r["status"] == "ok"]
    # the fullest record of the check (rows measured before it recorded float32 strays say less)
    checked = max((r["same_losses"] for r in measured if "same_losses" in r), key=len, default=None)
    plain_sgd = sorted({r["model"] for r in measured if r.get("optimizer_differs")})
    zeroed = sorted({r["model"] for r in measured if r.get("dropout_zeroed")})
    version = next((r["onnxruntime"] for r in measured if "onnxruntime" in r), None)
    lines = [
        "",
        "## ONNX files",
        "",
        "The .onnx file an ONNX Runtime user trains, for the models whose loss ONNX Runtime's LossType states "
        "(cross entropy on the logits): the model alone, exported by torch's TorchScript ONNX exporter in "
        "training mode (BatchNormalization trains) with its parameters unfolded, its LayerNormalizations given "
        "the statistics outputs ONNX Runtime's gradient reads (bench/child.py's export_onnx_file). Both systems "
        "train that file with one recipe: the scheme's tensors (whole) as requires_grad and the other parameters "
        "as frozen_params, LossType.CrossEntropyLoss, ONNX Runtime's optimizer with the model's learning rate"
        + (
            f" (AdamW, or SGD without momentum where the model trains with momentum SGD: {', '.join(plain_sgd)})"
            if plain_sgd
            else ""
        )
        + f". ONNX Runtime{f' (onnxruntime {version})' if version else ''}: generate_artifacts (its setup s), "
        "trained by its on-device API in a process that never imports torch (bench/ort_child.py). pock-mlir: "
        "pock.from_ort_recipe with the same arguments (its compile s), written as a device bundle and trained by "
        "Trainer.from_bundle in a process that never imports torch (bench/deployed_child.py). Peak memory: each "
        "process's over its resident set after its runtime's imports. Speed-up: ONNX Runtime's step time over "
        "pock-mlir's; memory: pock-mlir's peak over ONNX Runtime's. The rows of a pair are reported once "
        + (
            f"the losses of their {checked['steps']} warm-up steps agree within a relative {checked['rel_tolerance']:g}, "
            f"or, on the plain-SGD rows, within {2 * checked.get('float32_slack', 0):g} times as far as PyTorch's own "
            "float32 loss strays from its float64 loss at that step where that is larger (a trajectory that "
            "amplifies rounding, as train-mode BatchNorm on a small batch does; torch.optim has no ONNX Runtime AdamW "
            "to measure it with)"
            if checked and "float32_slack" in checked
            else f"the losses of their {checked['steps']} warm-up steps agree within a relative {checked['rel_tolerance']:g}"
            if checked
            else "the losses of their warm-up steps agree"
        )
        + " (else both fail and say where they differ)."
        + (
            f" Dropouts are exported at p = 0 ({', '.join(zeroed)}): the two runtimes draw their masks apart."
            if zeroed
            else ""
        ),
        "",
        "| model | scheme | trained values | ONNX Runtime step ms | pock-mlir step ms | speed-up | speed-up, "
        "fastest steps | ONNX Runtime peak MB | pock-mlir peak MB | memory | loss (ONNX Runtime, pock-mlir) | "
        "ONNX Runtime setup s | pock-mlir compile s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (model, scheme), pair in pairs.items():
        title = titles.get(model, model)
        a, b = pair.get(ort, {"status": "not measured"}), pair.get(pock, {"status": "not measured"})
        shown = scheme if scheme == "full" else f"{scheme} ({(a if 'scheme_used' in a else b).get('scheme_used', '?')})"
        if a["status"] != "ok" or b["status"] != "ok":
            status = a["status"] if a["status"] != "ok" else b["status"]
            lines.append(f"| {title} | {shown} |  | {status} |  |  |  |  |  |  |  |  |  |")
            continue
        lines.append(
            f"| {title} | {shown} | {_fmt(a.get('trainable_params'), '{:,}')} | {a['step_ms']:.2f} | "
            f"{b['step_ms']:.2f} | {a['step_ms'] / b['step_ms']:.2f}x | {a['step_ms_min'] / b['step_ms_min']:.2f}x | "
            f"{a['peak_mb']:.1f} | {b['peak_mb']:.1f} | {b['peak_mb'] / a['peak_mb']:.2f}x | "
            f"{a['loss']:.4f}, {b['loss']:.4f} | {_fmt(a.get('compile_s'), '{:.1f}')} | "
            f"{_fmt(b.get('compile_s'), '{:.1f}')} |"
        )
    return lines


def profile_section(rows: list[dict], top: int = 6) -> list[str]:
    """Each profiled pock-mlir step's dispatch time by kind of dispatch and its slowest dispatches
    (IREE HAL host-execution profiling)."""
    profiled = [r for r in rows if r.get("profile")]
    if not profiled:
        return []
    lines = [
        "",
        "## Where pock-mlir's time goes",
        "",
        "Per-dispatch wall time of the step as the Trainer runs it (train_step_into) from IREE's HAL profiling (iree-benchmark-module "
        "--device_profiling_mode=host-execution, aggregated by iree-profile statistics); ms per step. Dispatches "
        "run on both cores at once, so their sum can exceed the step time. A dispatch can run several times a "
        'step (IREE shares one executable among identical ones), hence "N runs of K dispatches".'
        + (
            " By kind: the share of that time of each kind of dispatch, as IREE names it after its root op (a "
            "step of many small dispatches spreads its time, and its slowest dispatches say little)."
            if any(r["profile"].get("by_kind") for r in profiled)
            else ""
        ),
        "",
    ]
    for r in profiled:
        p = r["profile"]
        kinds = "; ".join(f"{k['kind']} {100 * k['share']:.0f}%" for k in p.get("by_kind", [])[:top])
        slowest = "; ".join(f"`{d['name']}` {d['ms_per_step']:.2f} ({100 * d['share']:.0f}%)" for d in p["top"][:top])
        lines.append(
            f"- **{r['model']} / {r['scheme']}**: {p['dispatch_ms_per_step']:.2f} ms in "
            f"{p['dispatch_runs_per_step']:.0f} runs of {p['dispatches']} dispatches "
            f"(step {r['step_ms']:.2f} ms){f'; by kind: {kinds}' if kinds else ''}: {slowest}"
        )
    return lines


def write_plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results["rows"] if r["status"] == "ok" and r["system"] not in ONNX_FILE_SYSTEMS]
    groups = list(dict.fromkeys((r["model"], r["scheme"]) for r in rows)) or [("none", "")]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(max(6, 1.6 * len(groups) + 2), 7), constrained_layout=True)
    width = 0.8 / max(1, len(systems))
    for ax, key, label in ((axes[0], "step_ms", "train step, ms (log)"), (axes[1], "peak_mb", "peak memory, MB (log)")):
        for i, system in enumerate(systems):
            xs, ys = [], []
            for g, (model, scheme) in enumerate(groups):
                row = _find(rows, model, scheme, system)
                if row and row[key] > 0:
                    xs.append(g + (i - (len(systems) - 1) / 2) * width)
                    ys.append(row[key])
            ax.bar(xs, ys, width, label=SYSTEM_TITLES.get(system, system))
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.set_xticks(range(len(groups)), [f"{m}\n{s}" for m, s in groups])
    axes[0].legend(fontsize="small", ncols=2)
    axes[0].set_title(f"pock-mlir benchmark, {results['machine']['cpu']}, {results['machine']['threads']} threads")
    atomic_save(path, lambda f: fig.savefig(f, dpi=110, format="png"))
    plt.close(fig)
