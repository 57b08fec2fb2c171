"""One measurement in its own process: `python -m bench.child '<json spec>'` prints `RESULT <json>`.
A training system says READY after its warm-up and then takes commands on stdin, one a line:
`round` times a round of steps, `done` ends (by hand: `printf 'round\ndone\n' | python -m bench.child ...`).

Each system runs in a fresh process so that its peak memory is its own. Peak memory is the
process's peak resident set during the timed steps (the kernel's high-water mark, reset by
writing 5 to /proc/self/clear_refs after warm-up; bench/memory.py) minus the resident set right after the
imports every child shares (torch, numpy, the IREE runtime, pock_mlir): what the model, its
parameters, gradients, optimizer state, activations and the framework's working memory take.
pock-mlir compiles in one child and trains in another, so compiler memory is not counted.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import pickle
import statistics
import sys
import time
import traceback

import iree.runtime  # noqa: F401  (part of the shared import baseline)
import numpy as np
import torch

import pock_mlir as pock
from bench.memory import reset_peak, rss_kb
from bench.models import MODELS, scheme_spec, trainable_names
from pock_mlir.frontend import resolve_loss


def first_line(error: Exception) -> str:
    """The informative head of an error: its first line, joined with the next when it ends in ':'."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()] or [type(error).__name__]
    head = lines[0] + (" " + lines[1] if lines[0].endswith(":") and len(lines) > 1 else "")
    return head[:300]


def timed_rounds(step, spec) -> dict:
    """Warm up, reset the memory high-water mark, say READY, then time one round of steps for each
    `round` line on stdin until `done` (each step returns the loss as a Python float, which waits
    for the step to finish). The parent interleaves the rounds of every system of one model and
    scheme, so a burst of other jobs on the shared machine hits them alike; a round starts with one
    untimed step, which brings caches and idle worker threads back after another process ran. The
    round with the lowest median counts."""
    for _ in range(spec["warmup"]):
        step()
    reset_peak()
    print("READY", flush=True)
    rounds, loss = [], None
    for command in sys.stdin:
        if command.strip() != "round":
            break
        step()
        times = []
        for _ in range(spec["steps"]):
            start = time.perf_counter()
            loss = step()
            times.append(time.perf_counter() - start)
        rounds.append(times)
        print(f"ROUND {1000 * statistics.median(times):.3f}", flush=True)
    if not rounds:
        raise RuntimeError("the parent asked for no round of timed steps")
    best = min(rounds, key=statistics.median)
    return {"step_ms": 1000 * statistics.median(best), "step_ms_min": 1000 * min(best),
            "step_ms_max": 1000 * max(best), "steps": spec["steps"], "rounds": len(rounds), "loss": float(loss),
            "peak_kb": rss_kb("VmHWM")}


def _setup(spec):
    model_def = MODELS[spec["model"]]
    module = model_def.build()
    inputs, target = model_def.batch()
    scheme, label = scheme_spec(model_def, spec["scheme"])
    return model_def, module, inputs, target, scheme, label


def with_peft_adapters(scheme: dict, module):
    """`module` under PEFT's LoRA, with the adapters and the other trained modules the pock-mlir
    scheme names (PyTorch's LoRA baseline)."""
    import peft

    from pock_mlir.sparse import lora_adapters

    adapters = lora_adapters(scheme, module)
    others = trainable_names({k: v for k, v in scheme.items() if not str(v).startswith("lora")}, module)
    config = peft.LoraConfig(r=adapters[0].r, lora_alpha=adapters[0].alpha, target_modules=[a.module for a in adapters],
                             modules_to_save=sorted({n.rpartition(".")[0] for n in others}) or None)
    return peft.get_peft_model(module, config)


def run_torch(spec, compiled: bool) -> dict:
    model_def, module, inputs, target, scheme, label = _setup(spec)
    if spec["scheme"] == "lora":
        module = with_peft_adapters(scheme, module)
        trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    else:
        trainable = trainable_names(scheme, module)
    for name, p in module.named_parameters():
        p.requires_grad_(name in trainable)
    params = [p for n, p in module.named_parameters() if n in trainable]
    optimizer = model_def.optimizer.torch_optimizer(params)
    loss_fn = resolve_loss(model_def.loss)
    forward = torch.compile(module) if compiled else module

    def forward_backward():
        loss = loss_fn(forward(*inputs), target)
        loss.backward()
        return loss

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = forward_backward()
        optimizer.step()
        return loss.item()

    result = {"scheme_used": label, "trainable_params": sum(p.numel() for p in params)}
    warmup = spec["warmup"]
    if compiled:
        start = time.perf_counter()
        step()  # compiles; it is also the first warm-up step, so every system takes the same steps
        result["compile_s"] = time.perf_counter() - start
        warmup -= 1
    result.update(timed_rounds(step, {**spec, "warmup": max(warmup, 0)}))
    if spec.get("count_flops"):
        from torch.utils.flop_counter import FlopCounterMode

        optimizer.zero_grad(set_to_none=True)
        counter = FlopCounterMode(display=False)
        with counter:
            forward_backward()
        result["flops"] = counter.get_total_flops()
    return result


def compile_pock(spec) -> dict:
    model_def, module, inputs, target, scheme, label = _setup(spec)
    start = time.perf_counter()
    program = pock.compile_training(module, inputs, target, loss=model_def.loss, optimizer=model_def.optimizer,
                                    sparse=None if scheme == "full" else scheme, iree_flags=tuple(spec["iree_flags"]),
                                    pipelines=spec.get("pipelines"), cache=False)  # time the compilation itself
    compile_s = time.perf_counter() - start
    # what training needs, without the IR text of every stage (which would stay resident in the run)
    runnable = dataclasses.replace(program, stages={})
    runnable.__dict__.update(vmfb=program.vmfb, state_in_place=program.state_in_place)
    with open(spec["program"], "wb") as f:
        pickle.dump(runnable, f)
    return {"scheme_used": label, "compile_s": compile_s, "compile_breakdown_s": dict(program.timings),
            "iree_flags": program.iree_flags()}


def run_pock(spec) -> dict:
    model_def = MODELS[spec["model"]]
    inputs, target = model_def.batch()
    inputs = tuple(x.numpy().astype(np.int32) if x.dtype == torch.int64 else x.numpy() for x in inputs)
    target = target.numpy().astype(np.int32) if target.dtype == torch.int64 else target.numpy()
    with open(spec["program"], "rb") as f:
        program = pickle.load(f)
    trainer = program.trainer(retain_memory=spec.get("retain_memory", True))
    del program  # the trainer holds what it needs on the device
    gc.collect()
    result = timed_rounds(lambda: trainer.step(inputs, target), spec)
    if spec.get("profile"):
        from bench.profile import profile_step

        with open(spec["program"], "rb") as f:
            result["profile"] = profile_step(pickle.load(f), inputs, target)
    return result


def measure_sgemm(spec) -> dict:
    """Practical single-precision matmul peak with every thread: the best of torch and numpy."""
    n, repeats = spec.get("size", 2048), 5
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = {}
    for name, mm, x, y in (("torch", torch.mm, a, b), ("numpy", np.matmul, a.numpy(), b.numpy())):
        mm(x, y)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            mm(x, y)
            times.append(time.perf_counter() - start)
        best[name] = 2 * n ** 3 / min(times) / 1e9
    return {"sgemm_gflops": best, "peak_gflops": max(best.values())}


RUNNERS = {
    "eager": lambda spec: run_torch(spec, compiled=False),
    "torch.compile": lambda spec: run_torch(spec, compiled=True),
    "pock-compile": compile_pock,
    "pock-run": run_pock,
    "sgemm": measure_sgemm,
}


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(spec["threads"])
    baseline_kb = rss_kb()
    try:
        result = {"status": "ok", **RUNNERS[spec["task"]](spec)}
        if "peak_kb" in result:
            result["peak_mb"] = (result.pop("peak_kb") - baseline_kb) / 1024
    except (pock.CompileError, pock.FrontendError) as e:  # a missing rule or an op the importer lacks
        result = {"status": f"not supported yet: {first_line(e)}"}
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("examples"):
            raise
        result = {"status": f"not supported yet: {e.name.replace('.', '/')}.py does not exist yet"}
    except Exception as e:  # any failure becomes a row in the results, not a crashed run
        result = {"status": f"failed: {type(e).__name__}: {first_line(e)}", "traceback": traceback.format_exc()[-3000:]}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
