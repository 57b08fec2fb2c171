"""`python -m bench` (or `make bench`): train-step time, peak memory and loss of every model x
scheme x system, side by side in one run; writes results.json, results.md and results.png. The systems:
PyTorch eager and torch.compile, ONNX Runtime's on-device training (exported and set up in
bench/child.py, timed in bench/ort_child.py, which never imports torch), JAX for the LLaMA-like
decoders (a port of the model in bench/jax_child.py, also without torch), ExecuTorch's training
(exported in bench/child.py, timed in bench/executorch_child.py, its losses checked against eager's
first) and pock-mlir; and, in a table of their own, ONNX Runtime and pock-mlir training the model's
.onnx file with ONNX Runtime's recipe (ONNX_FILE_SYSTEMS).

    python -m bench                       # everything (about 50 minutes on 2 cores)
    python -m bench --quick               # the MLP, few steps: a smoke test of the harness
    python -m bench --models mlp,bert --schemes sparse --systems eager,pock-mlir
    python -m bench --update --models kws       # re-measure a model a busy moment disturbed, keep the rest
    python -m bench --systems ort-training-onnx,pock-mlir-onnx  # the ONNX files' rows alone
    python -m bench --recount-flops             # count the stored rows' FLOPs again (bench/flops.py); times nothing
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.models import MODELS, ORT_LOSS_TYPES, PEFT_SCHEMES, QUICK_MODELS, SCHEMES, ort_optimizer, runs_scheme
from bench.report import ONNX_FILE_SYSTEMS, add_ratios, write_markdown, write_plot
from pock_mlir.files import atomic_write
from pock_mlir.stages import pipelines_with_switch, pipelines_without
from pock_mlir.tuning import host_cpu

ROOT = Path(__file__).resolve().parent.parent
SYSTEMS = (
    "eager",
    "torch.compile",
    "ort-training",
    "jax",
    "executorch",
    "pock-mlir",
    "pock-mlir-deployed",
    "pock-mlir-deployed-ort-optimizer",
    "pock-mlir-no-reorder",
    "pock-mlir-no-param-order",
    "pock-mlir-no-retain",
    "pock-mlir-other-tails",
    "pock-mlir-no-factor-reductions",
    "pock-mlir-no-per-image",
    "pock-mlir-no-flipped",
    "ort-training-onnx",
    "pock-mlir-onnx",
)
QUICK_SYSTEMS = (
    "eager",
    "pock-mlir",
    "pock-mlir-no-reorder",
    "pock-mlir-no-param-order",
    "pock-mlir-no-retain",
    "pock-mlir-other-tails",
)
# The pipelines of the pipeline ablations: a pass left out of the lowered stage, or a form pock-backend-switch
# may not choose.
ABLATED_PIPELINES = {
    "pock-mlir-no-reorder": pipelines_without("pock-reorder-updates"),
    "pock-mlir-no-param-order": pipelines_without("pock-order-param-reads"),
    "pock-mlir-no-factor-reductions": pipelines_without("pock-factor-reductions"),
    "pock-mlir-no-per-image": pipelines_with_switch("exclude=per-image"),
    "pock-mlir-no-flipped": pipelines_with_switch("exclude=flipped"),
}
# pock-reorder-updates' effect is shown on these full-BP steps only: each ablation is one more
# IREE compile (minutes for the CNNs), and the pass measured no effect under IREE so far.
REORDER_ABLATION = (("mlp", "full"), ("mlp", "sparse"), ("bert", "full"))
# The Trainer's retained freed memory (pock_mlir/runtime/memory.py) trades peak memory for step time;
# these rows show both sides, on the models whose steps allocate the most.
RETAIN_ABLATION = (
    ("mlp", "full"),
    ("resnet18", "full"),
    ("resnet18", "sparse"),
    ("bert", "sparse"),
    ("llama", "full"),
    ("llama", "sparse"),
)
# Without pock-order-param-reads the parameters fail the in-place check and take a second set:
# these rows show what that costs in memory and what the added order costs in step time.
PARAM_ORDER_ABLATION = (
    ("mlp", "full"),
    ("mobilenetv2", "full"),
    ("resnet18", "full"),
    ("bert", "full"),
    ("kws", "full"),
)
# pock-backend-switch chooses per program whether vectorized loops' remainders are masked or
# peeled (tuning.choose_vector_tails); these rows compile the same program with the other one, on
# the models with loops of odd lengths (the ViT's 65 tokens, the keyword spotter's 98 frames,
# MobileNetV2's 24-, 12- and 6-pixel maps) and the MLP.
OTHER_TAILS = "pock-mlir-other-tails"
OTHER_TAILS_ABLATION = (("mlp", "full"), ("tiny-vit", "full"), ("kws", "full"), ("mobilenetv2", "full"))
# pock-factor-reductions halves a batch norm's backward sums: the full steps of the CNNs with batch norms.
FACTOR_REDUCTIONS_ABLATION = (
    ("mobilenetv2", "full"),
    ("resnet18", "full"),
    ("tv-mobilenetv2", "full"),
    ("kws", "full"),
)
# The per-image form of 1x1 convolutions, where the tuning table chooses it: the MobileNetV2s' full steps.
PER_IMAGE_ABLATION = (("mobilenetv2", "full"), ("tv-mobilenetv2", "full"))
# The flipped form of stride-1 input gradients, where the tuning table chooses it: the ResNet-18-like's full step.
FLIPPED_ABLATION = (("resnet18", "full"),)
ABLATIONS = {
    "pock-mlir-no-reorder": REORDER_ABLATION,
    "pock-mlir-no-param-order": PARAM_ORDER_ABLATION,
    "pock-mlir-no-retain": RETAIN_ABLATION,
    OTHER_TAILS: OTHER_TAILS_ABLATION,
    "pock-mlir-no-factor-reductions": FACTOR_REDUCTIONS_ABLATION,
    "pock-mlir-no-per-image": PER_IMAGE_ABLATION,
    "pock-mlir-no-flipped": FLIPPED_ABLATION,
}
ORT_SCHEMES = ("full", "sparse")  # ONNX Runtime trains or freezes whole parameters: no LoRA adapters
JAX_SCHEMES = ("full", "sparse")  # the JAX port differentiates the trained parameters only: no LoRA adapters
EXECUTORCH_SCHEMES = ("full", "sparse")  # its joint graph trains whole parameters: no LoRA adapters
DEPLOYED_SCHEMES = ("full", "sparse")  # pock-mlir's bundle in a torch-free process, beside ONNX Runtime's
# The deployed bundle compiled with the optimizer ONNX Runtime runs (bench.models.ort_optimizer), on
# the models where that differs from theirs: ONNX Runtime's memory against the same training.
ORT_OPTIMIZER = "pock-mlir-deployed-ort-optimizer"
# pock-mlir's full step, compiled and timed in another scheme's rounds (bench.held_out's sparse rounds):
# a sparse step over the full step timed beside it, as alike disturbed as the systems of one scheme.
FULL_BESIDE = "pock-mlir-full-beside"
# The ONNX file's rows (ONNX_FILE_SYSTEMS): the model's .onnx file (bench/child.py's "onnx-file", on
# the models whose loss ONNX Runtime's LossType states) trained by ONNX Runtime (generate_artifacts)
# and by pock-mlir (pock.from_ort_recipe, its deployed bundle) with the same recipe. They compare with
# each other only, are measured as a pair, and are reported once their warm-up losses agree
# (check_same_losses: relative, on each warm-up step's loss, for the float32 rounding of two
# runtimes' kernels a few steps in; or, where PyTorch's own float32 run strays further from float64
# there, SAME_LOSS_SLACK times that stray for each of the two, as tests/oracle.py holds pock-mlir).
SAME_LOSS_TOLERANCE = 1e-4
SAME_LOSS_SLACK = 10.0
THREADS = os.cpu_count() or 1  # IREE's local-task driver starts one worker per core; torch and ONNX Runtime get as many
# tasks in a child of their own, which does not import torch (but ExecuTorch's runtime does); the rest run in bench.child
CHILD_MODULES = {
    "ort-run": "bench.ort_child",
    "jax-run": "bench.jax_child",
    "executorch-run": "bench.executorch_child",
    "pock-deployed": "bench.deployed_child",
}
# peers whose model bench/child.py exports (with torch) for a child of their own that trains it
EXPORTED_PEERS = {
    "ort-training": ("ort-export", "ort-run"),
    "jax": ("jax-export", "jax-run"),
    "executorch": ("executorch-export", "executorch-run"),
}


def pock_flags() -> list[str]:
    from pock_mlir.targets import resolve_target

    return resolve_target("host").compile_flags()


def _child_command(spec: dict) -> list[str]:
    return [
        sys.executable,
        "-m",
        CHILD_MODULES.get(spec["task"], "bench.child"),
        json.dumps({"threads": THREADS, **spec}),
    ]


def _result(stdout: str, stderr: str, returncode) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"status": f"failed: child exited with {returncode}: {tail[:300]}"}


def run_child(spec: dict, timeout: float) -> dict:
    """A one-shot child (compile, sgemm): its RESULT."""
    try:
        done = subprocess.run(_child_command(spec), cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"failed: timed out after {timeout:.0f}s"}
    return _result(done.stdout, done.stderr, done.returncode)


def wait_until_idle(pid: int, limit_s: float = 2.0) -> None:
    """Return once no thread of process `pid` is running (or after limit_s): ONNX Runtime's and
    OpenMP's thread pools spin on after their work (ONNX Runtime's for about 30 ms after a round,
    measured), which would take a core from the next system's timed steps. Linux's /proc tells;
    elsewhere it returns at once."""
    threads, deadline = Path(f"/proc/{pid}/task"), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            running = any(_running(thread) for thread in threads.iterdir())
        except OSError:  # no /proc here, or the process has ended
            return
        if not running:
            return
        time.sleep(0.001)


def _running(thread: Path) -> bool:
    try:
        return (thread / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
    except OSError:  # the thread has ended
        return False


class TrainingChild:
    """A system training in its own process, timed one round at a time (bench/child.py's commands)."""

    def __init__(self, spec: dict, timeout: float):
        self.timeout, self.failure, self.stdout = timeout, None, []
        self.stderr = tempfile.TemporaryFile(mode="w+")  # a pipe nobody reads could fill and stall the child
        self.process = subprocess.Popen(
            _child_command(spec), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        if self._expect("READY"):
            wait_until_idle(self.process.pid)

    def _read(self):
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _expect(self, prefix: str) -> str | None:
        """The next line starting with `prefix`; on exit or timeout, None with self.failure set."""
        deadline = time.monotonic() + self.timeout
        while self.failure is None:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                self.process.kill()
                self.failure = {"status": f"failed: timed out after {self.timeout:.0f}s"}
                break
            if line is None:
                self.process.wait()
                self.stderr.seek(0)
                self.failure = _result("".join(self.stdout), self.stderr.read(), self.process.returncode)
                break
            self.stdout.append(line)
            if line.startswith(prefix):
                return line
        return None

    def round(self) -> None:
        if self.failure is None:
            self.process.stdin.write("round\n")
            self.process.stdin.flush()
            if self._expect("ROUND "):
                wait_until_idle(self.process.pid)

    def finish(self) -> dict:
        if self.failure is None:
            self.process.stdin.write("done\n")
            self.process.stdin.close()
            line = self._expect("RESULT ")
            if line is not None:
                self.process.wait()
                return json.loads(line[len("RESULT ") :])
        return self.failure


def check_same_losses(rows: dict[str, dict], systems=ONNX_FILE_SYSTEMS) -> None:
    """Fail the rows of `systems` (which train the same file with the same recipe) unless each
    warm-up step's loss agrees between them within SAME_LOSS_TOLERANCE, or within twice
    SAME_LOSS_SLACK times PyTorch's float32 stray from float64 at that step where the file's row
    measured it ("float32_strays"): their times compare the same training only then."""
    first, second = (rows.get(system, {}) for system in systems)
    if not (first.get("status") == second.get("status") == "ok"):
        return
    a, b = first.pop("warmup_losses"), second.pop("warmup_losses")
    strays = first.get("float32_strays") or [0.0] * len(a)
    bounds = [
        max(SAME_LOSS_TOLERANCE * max(abs(x), abs(y)), 2 * SAME_LOSS_SLACK * stray) for x, y, stray in zip(a, b, strays)
    ]
    differ = [
        f"step {i + 1}: {x:.6g} against {y:.6g}"
        for i, (x, y, bound) in enumerate(zip(a, b, bounds))
        if abs(x - y) > bound
    ]
    if len(a) != len(b) or not a:
        differ = [f"{len(a)} and {len(b)} warm-up losses; give --warmup 1 or more"]
    for row in (first, second):
        if differ:
            row["status"] = f"failed: the two systems' losses on the same file differ ({'; '.join(differ[:3])})"
        else:
            row["same_losses"] = {
                "steps": len(a),
                "rel_tolerance": SAME_LOSS_TOLERANCE,
                "float32_slack": SAME_LOSS_SLACK,
                "bounds": bounds,
            }


def measure(model: str, scheme: str, systems, args, workdir: Path) -> dict[str, dict]:
    """Every system's row for one model and scheme. The pock-mlir variants compile first, and
    ONNX Runtime's artifacts are generated, one process each; then every system starts training in
    its own process and they take turns, round by round, so that what other jobs on the machine do
    hits them alike."""
    common = {"model": model, "scheme": scheme, "warmup": args.warmup, "steps": args.steps}
    rows, children, outputs = {}, {}, []
    bundle = workdir / f"{model}-{scheme}-bundle"  # the pock-mlir row's, for pock-mlir-deployed
    onnx_file, exported = workdir / f"{model}-{scheme}-onnx-file", None  # the ONNX file's rows'
    for system in systems:
        if system in ONNX_FILE_SYSTEMS:
            if exported is None:
                outputs.append(onnx_file)
                exported = run_child({**common, "task": "onnx-file", "file": str(onnx_file)}, args.timeout)
            rows[system] = dict(exported)
            if exported["status"] != "ok":
                continue
            output = workdir / f"{model}-{scheme}-{system}"
            outputs.append(output)
            setup, run = (
                (
                    {"task": "ort-file-artifacts", "artifacts": str(output)},
                    {"task": "ort-run", "artifacts": str(output)},
                )
                if system == "ort-training-onnx"
                else (
                    {"task": "pock-file-compile", "bundle": str(output), "iree_flags": args.iree_flags},
                    {"task": "pock-deployed", "bundle": str(output)},
                )
            )
            made = run_child({**common, **setup, "file": str(onnx_file)}, args.timeout)
            rows[system].update(made)
            if made["status"] == "ok":
                children[system] = TrainingChild(
                    {**common, **run, "learning_rate": exported["learning_rate"], "warmup_losses": True}, args.timeout
                )
            continue
        if system in ("eager", "torch.compile"):
            children[system] = TrainingChild({**common, "task": system, "count_flops": system == "eager"}, args.timeout)
            continue
        if system in EXPORTED_PEERS:
            export, run = EXPORTED_PEERS[system]
            artifacts = workdir / f"{model}-{scheme}-{system}"
            outputs.append(artifacts)
            rows[system] = run_child({**common, "task": export, "artifacts": str(artifacts)}, args.timeout)
            if rows[system]["status"] == "ok":
                learning_rate = {k: v for k, v in rows[system].items() if k == "learning_rate"}
                children[system] = TrainingChild(
                    {**common, "task": run, "artifacts": str(artifacts), **learning_rate}, args.timeout
                )
            continue
        if system == ORT_OPTIMIZER:  # a program and bundle of its own, trained by the deployed child
            own_bundle, program = (
                workdir / f"{model}-{scheme}-{system}-bundle",
                workdir / f"{model}-{scheme}-{system}.pickle",
            )
            outputs += [own_bundle, program]
            rows[system] = run_child(
                {
                    **common,
                    "task": "pock-compile",
                    "program": str(program),
                    "iree_flags": args.iree_flags,
                    "ort_optimizer": True,
                    "bundle": str(own_bundle),
                },
                args.timeout,
            )
            if rows[system]["status"] == "ok":
                children[system] = TrainingChild(
                    {**common, "task": "pock-deployed", "bundle": str(own_bundle)}, args.timeout
                )
            continue
        if system == "pock-mlir-deployed":  # pock-mlir's own program, from the bundle its compilation wrote
            compiled = rows.get("pock-mlir", {"status": "not run: it deploys the pock-mlir row's bundle"})
            rows[system] = {
                k: v for k, v in compiled.items() if k in ("status", "scheme_used", "compile_s", "trainable_params")
            }
            if compiled["status"] == "ok":
                children[system] = TrainingChild(
                    {**common, "task": "pock-deployed", "bundle": str(bundle)}, args.timeout
                )
            continue
        program = workdir / f"{model}-{scheme}-{system}.pickle"
        outputs.append(program)
        deployed = system == "pock-mlir" and "pock-mlir-deployed" in systems
        outputs += [bundle] if deployed else []
        pipelines = ABLATED_PIPELINES.get(system)
        system_common = {**common, "scheme": "full"} if system == FULL_BESIDE else common
        rows[system] = run_child(
            {
                **system_common,
                "task": "pock-compile",
                "program": str(program),
                "iree_flags": args.iree_flags,
                "other_tails": system == OTHER_TAILS,
                "pipelines": pipelines,
                "tuning": args.tuning,
                **({"bundle": str(bundle)} if deployed else {}),
            },
            args.timeout,
        )
        if rows[system]["status"] == "ok":
            children[system] = TrainingChild(
                {
                    **system_common,
                    "task": "pock-run",
                    "program": str(program),
                    "retain_memory": system != "pock-mlir-no-retain",
                    "profile": args.profile and system == "pock-mlir",
                },
                args.timeout,
            )
    for _ in range(args.rounds):
        for child in children.values():
            child.round()
    for system, child in children.items():
        rows[system] = {**rows.get(system, {}), **child.finish()}
    check_same_losses(rows)
    for output in outputs:
        if output.is_dir():
            shutil.rmtree(output)
        else:
            output.unlink(missing_ok=True)
    return {system: rows[system] for system in systems}


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help=f"only {', '.join(QUICK_MODELS)}, 5 steps, no torch.compile"
    )
    parser.add_argument("--models", help=f"comma-separated subset of {','.join(MODELS)}")
    parser.add_argument("--schemes", help=f"comma-separated subset of {','.join(SCHEMES)}")
    parser.add_argument("--systems", help=f"comma-separated subset of {','.join(SYSTEMS)}")
    parser.add_argument("--steps", type=int, help="timed steps per measurement (default 20; 5 with --quick)")
    parser.add_argument(
        "--rounds", type=int, help="rounds of timed steps; the steadiest counts (default 5; 1 with --quick)"
    )
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 3; 2 with --quick)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one child may take")
    parser.add_argument(
        "--iree-flags",
        default=None,
        help="extra IREE compile flags for pock-mlir, space-separated (the host target's flags always apply)",
    )
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="per-dispatch profile of each pock-mlir step (default: on, off with --quick)",
    )
    parser.add_argument(
        "--rewrite-report",
        action="store_true",
        help="only rewrite results.md and results.png from the results.json in --out",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="re-measure every system of the --models (and --schemes) given and replace their rows in "
        "the results.json in --out, keeping the other rows; its settings must be the same",
    )
    parser.add_argument(
        "--recount-flops",
        action="store_true",
        help="only count again the FLOPs of PyTorch's step of each model (or of the --models) and "
        "scheme in the results.json in --out, and rewrite its GFLOP/s and reports; times nothing",
    )
    parser.add_argument("--out", default=str(ROOT / "bench"), help="directory for results.json/.md/.png")
    args = parser.parse_args(argv)

    def subset(text, allowed, default):
        chosen = tuple(text.split(",")) if text else default
        unknown = [c for c in chosen if c not in allowed]
        if unknown:
            parser.error(f"unknown {', '.join(unknown)}; choose from {', '.join(allowed)}")
        return chosen

    args.models_given, args.systems_given = bool(args.models), bool(args.systems)
    args.models = subset(args.models, MODELS, QUICK_MODELS if args.quick else tuple(MODELS))
    args.schemes = subset(args.schemes, SCHEMES, SCHEMES)
    args.systems = subset(args.systems, SYSTEMS, QUICK_SYSTEMS if args.quick else SYSTEMS)
    if len(set(args.systems) & set(ONNX_FILE_SYSTEMS)) == 1:
        parser.error(f"the ONNX file's rows are measured as a pair: give both {' and '.join(ONNX_FILE_SYSTEMS)}")
    args.steps = args.steps or (5 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.iree_flags = args.iree_flags.split() if args.iree_flags else []
    args.tuning = None  # this CPU's table (bench.held_out --as-unmeasured-cpu gives another's)
    args.profile = not args.quick if args.profile is None else args.profile
    args.previous = previous_results(parser, args) if args.update else None
    if args.recount_flops:
        try:
            args.previous = json.loads((Path(args.out) / "results.json").read_text())
            args.previous["rows"], args.previous["machine"]  # what recounted() reads
        except (OSError, ValueError, KeyError, TypeError) as e:
            parser.error(f"--recount-flops needs the results.json of an earlier run in {args.out} ({e}); run the bench")
    return args


def previous_results(parser, args) -> dict:
    """The results.json an --update run replaces rows of, checked before anything is measured: the
    rows it keeps must compare with the new ones (the same machine and settings)."""
    if not args.models_given:
        parser.error("--update re-measures the models given with --models; name them")
    if args.systems_given:
        parser.error("--update re-measures every system of a model side by side; leave out --systems")
    path = Path(args.out) / "results.json"
    try:
        previous = json.loads(path.read_text())
        settings = previous["settings"]
        kept = {
            "cpu": previous["machine"]["cpu"],
            **{k: settings[k] for k in ("steps", "rounds", "warmup")},
            "pock_iree_flags": settings["pock_iree_flags"],
            "rounds_start_idle": settings.get("rounds_start_idle", False),
        }
        if "cpu_id" in previous["machine"]:  # runs before it was recorded have the model name alone
            kept["cpu_id"] = previous["machine"]["cpu_id"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        parser.error(f"--update needs the results.json of an earlier run in {args.out} ({e}); run the bench without it")
    now = {
        "cpu": _cpu_name(),
        "cpu_id": host_cpu(),
        "steps": args.steps,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "pock_iree_flags": pock_flags() + args.iree_flags,
        "rounds_start_idle": True,
    }
    differ = [f"{k} {kept[k]!r} there, {now[k]!r} here" for k in kept if kept[k] != now[k]]
    if differ:
        parser.error(f"--update keeps rows measured otherwise ({'; '.join(differ)}); run the whole bench instead")
    return previous


def updated(previous: dict, rows: list[dict], update: dict) -> dict:
    """`previous` results with the rows of each (model, scheme) in `rows` replaced by those, in
    MODELS' and SCHEMES' order, and `update` (when, which models and schemes, the load) listed."""
    pairs = {(r["model"], r["scheme"]) for r in rows}
    kept = [dict(r) for r in previous["rows"] if (r["model"], r["scheme"]) not in pairs]  # add_ratios writes to them
    order = {name: i for i, name in enumerate(MODELS)}
    merged = sorted(kept + rows, key=lambda r: (order.get(r["model"], len(order)), SCHEMES.index(r["scheme"])))
    models = {**previous["settings"]["models"], **{m: MODELS[m].title for m in update["models"]}}
    return {
        **previous,
        "settings": {**previous["settings"], "models": models},
        "rows": add_ratios(merged, MODELS, previous["machine"].get("peak_gflops")),
        "updates": [*previous.get("updates", []), update],
    }


def recounted(previous: dict, models, timeout: float) -> dict:
    """`previous` results with the FLOPs of PyTorch's step counted again (bench/flops.py) for every
    (model, scheme) of `models` that has them, and the GFLOP/s that follow from them; the FLOPs
    depend on the model and scheme only, so no time is measured again."""
    rows = [dict(r) for r in previous["rows"]]  # add_ratios writes to them
    for row in rows:
        if row["model"] in models and "flops" in row:
            counted = run_child({"task": "count-flops", "model": row["model"], "scheme": row["scheme"]}, timeout)
            if counted["status"] != "ok":
                raise SystemExit(f"counting the FLOPs of {row['model']} {row['scheme']} failed: {counted['status']}")
            print(
                f"{row['model']:12s} {row['scheme']:9s} {row['flops'] / 1e9:8.2f} -> {counted['flops'] / 1e9:8.2f} GFLOP",
                flush=True,
            )
            row["flops"] = counted["flops"]
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return {**previous, "rows": add_ratios(rows, MODELS, previous["machine"].get("peak_gflops")), "flops_counted": now}


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    if args.rewrite_report:
        results = json.loads((out / "results.json").read_text())
        write_markdown(results, out / "results.md")
        write_plot(results, out / "results.png")
        return 0
    if args.recount_flops:
        models = args.models if args.models_given else MODELS
        results = recounted(args.previous, models, args.timeout)
        atomic_write(out / "results.json", json.dumps(results, indent=2) + "\n")
        write_markdown(results, out / "results.md")
        write_plot(results, out / "results.png")
        print(f"wrote {out / 'results.json'}, results.md and results.png")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    load_before = os.getloadavg()
    if args.update:  # the rows kept were measured against the earlier run's sgemm peak
        machine = args.previous["machine"]
    else:
        machine = run_child({"task": "sgemm", "size": 1024 if args.quick else 2048}, args.timeout)
        print(f"sgemm peak: {machine.get('peak_gflops', 0):.0f} GFLOP/s; load average {load_before[0]:.2f}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pock-bench-") as workdir:
        for model in args.models:
            for scheme in args.schemes:
                if not runs_scheme(MODELS[model], scheme):
                    continue
                systems = [
                    s
                    for s in args.systems
                    if (s not in ABLATIONS or (model, scheme) in ABLATIONS[s])
                    and (s != "jax" or MODELS[model].jax_port)
                    and (s != ORT_OPTIMIZER or ort_optimizer(MODELS[model].optimizer) != MODELS[model].optimizer)
                    and (s not in ONNX_FILE_SYSTEMS or MODELS[model].loss in ORT_LOSS_TYPES)
                    and scheme
                    in {
                        "ort-training": ORT_SCHEMES,
                        "jax": JAX_SCHEMES,
                        "executorch": EXECUTORCH_SCHEMES,
                        "pock-mlir-deployed": DEPLOYED_SCHEMES,
                        ORT_OPTIMIZER: DEPLOYED_SCHEMES,
                        **dict.fromkeys(ONNX_FILE_SYSTEMS, ORT_SCHEMES),
                    }.get(s, SCHEMES if s.startswith("pock-mlir") else ("full", "sparse", *PEFT_SCHEMES))
                ]
                for system, measured in measure(model, scheme, systems, args, Path(workdir)).items():
                    row = {"model": model, "scheme": scheme, "system": system, **measured}
                    rows.append(row)
                    shown = (
                        f"{row['step_ms']:.2f} ms, {row['peak_mb']:.0f} MB, loss {row['loss']:.4f}"
                        if row["status"] == "ok"
                        else row["status"]
                    )
                    print(f"{model:12s} {scheme:7s} {system:22s} {shown}", flush=True)
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    if args.update:
        results = updated(
            args.previous,
            rows,
            {
                "date": now,
                "models": list(args.models),
                "schemes": list(args.schemes),
                "load_before": load_before,
                "load_after": os.getloadavg(),
                "wall_s": time.time() - started,
            },
        )
    else:
        results = {
            "date": now,
            "machine": {
                "cpu": _cpu_name(),
                "cpu_id": host_cpu(),
                "cores": os.cpu_count(),
                "threads": THREADS,
                "python": platform.python_version(),
                "load_before": load_before,
                "load_after": os.getloadavg(),
                **machine,
            },
            "settings": {
                "steps": args.steps,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "pock_iree_flags": pock_flags() + args.iree_flags,
                "rounds_start_idle": True,
                "models": {m: MODELS[m].title for m in args.models},
            },
            "rows": add_ratios(rows, MODELS, machine.get("peak_gflops")),
            "wall_s": time.time() - started,
        }
    atomic_write(out / "results.json", json.dumps(results, indent=2) + "\n")
    write_markdown(results, out / "results.md")
    write_plot(results, out / "results.png")
    print(f"wrote {out / 'results.json'}, results.md and results.png in {(time.time() - started) / 60:.1f} min")
    return 0


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
