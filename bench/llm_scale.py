"""Fine-tuning at the sizes users train: a Llama-3.2-1B- and a LLaMA-2-7B-architecture decoder, measured.

    python -m bench.llm_scale [--arch 1b 7b] [--rows sparse-int4 lora-fp32 ...] [--seq-len 128]
                              [--steps 3] [--checkpoints DIR] [--out DIR]

For each architecture it writes random weights once as a bfloat16 Hugging Face checkpoint
(save_pretrained, in --checkpoints; kept for the next run), so the load path is the real one:
pock-mlir builds the model on the meta device and compiles it with weights=DIR; PyTorch loads it
with from_pretrained. Each row is a scheme over a base: sparse (PockEngine's transformer-last-2
preset, the blocks before it and the embedding frozen), LoRA r=8 on the attention projections, or
full BP; over a float32, int8 or int4 frozen base (quantize: {frozen: ...}). Per row, in fresh
processes one after the other (so a busy spell of the shared machine hits them alike): pock-mlir
compiling with an empty compile cache (cold), pock-mlir again from that cache, then PyTorch on the
same batch where it has the scheme (PEFT's LoRA and full BP, float32 bases: PyTorch has no int8 or
int4 training base on the CPU). Each process reports its compile time, the peak resident set of the
whole process (VmHWM: imports, loading, compiling and the steps; pock-mlir's also per phase, with
the device memory of its steps and their workspace), the median step time of --steps steps after
one warm-up, tokens/s, and the FLOPs of the scheme's step (PyTorch's, counted on the
meta device by bench/flops.py) over the machine's sgemm peak (bench/child.py, measured first). A
row whose estimated memory exceeds what the machine has free is not run, and says so.
Results go to DIR/llm_scale.json and llm_scale.md (default bench/runs/<machine>/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.machine import runs_dir

ROOT = Path(__file__).resolve().parent.parent
ARCHS = {
    # Llama-3.2-1B's shape (tied embeddings, grouped-query attention), 1.24 B parameters.
    "1b": {
        "title": "Llama-3.2-1B architecture",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "rope_theta": 500000.0,
        "tie_word_embeddings": True,
    },
    # LLaMA-2-7B's shape, 6.74 B parameters.
    "7b": {
        "title": "LLaMA-2-7B architecture",
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    # A stand-in to try the script in seconds.
    "tiny": {
        "title": "tiny LLaMA",
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    },
}
SCHEMES = ("sparse", "lora", "full")
BASES = ("fp32", "int8", "int4")
ROWS = [f"{s}-{b}" for s in SCHEMES for b in BASES]
DEFAULT_ROWS = ("sparse-fp32", "sparse-int8", "sparse-int4", "lora-fp32", "lora-int8", "lora-int4", "full-fp32")
LORA = "lora:r=8,alpha=16"
OPTIMIZER = {"lr": 1e-4, "weight_decay": 0.01}  # AdamW, both systems
BATCH = 1


def scheme_dict(arch: dict, scheme: str, base: str) -> dict | str:
    """compile_training's sparse= for a row."""
    layers = arch["num_hidden_layers"]
    if scheme == "sparse":
        spec = {"preset": "transformer-last-2", "model.embed_tokens": "frozen"}
        spec.update({f"model.layers.{i}": "frozen" for i in range(layers - 2)})
    elif scheme == "lora":
        spec = {"model.layers.*.self_attn": LORA}
    else:
        spec = {}
    if base != "fp32":
        spec["quantize"] = {"frozen": base}
    return spec or "full"


def _config(name: str, seq_len: int):
    import transformers

    arch = {k: v for k, v in ARCHS[name].items() if k != "title"}
    heads = arch["num_attention_heads"]
    return transformers.LlamaConfig(
        **arch,
        head_dim=arch["hidden_size"] // heads,
        max_position_embeddings=max(2048, seq_len),
        use_cache=False,
    )


def _batch(vocab: int, seq_len: int):
    import torch

    ids = torch.randint(0, vocab, (BATCH, seq_len + 1), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids[:, :-1]}, ids[:, 1:]


def _loss(output, target):
    import torch.nn.functional as F

    return F.cross_entropy(output.logits.flatten(0, 1), target.flatten())


def _meta_model(directory: str):
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(directory)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def _trainable(module, scheme) -> set[str]:
    from bench.models import trainable_names

    return trainable_names(scheme, module)


def child_pock(spec: dict) -> dict:
    import pock_mlir as pock
    from bench.memory import reset_peak, rss_kb

    arch = ARCHS[spec["arch"]]
    scheme = scheme_dict(arch, spec["scheme"], spec["base"])
    model = _meta_model(spec["dir"])
    model.train()
    inputs, target = _batch(model.config.vocab_size, spec["seq_len"])
    start = time.perf_counter()
    program = pock.compile_training(
        model, inputs, target, loss=_loss, optimizer=pock.AdamW(**OPTIMIZER), sparse=scheme, weights=spec["dir"]
    )
    compile_s = time.perf_counter() - start
    # Each phase's own peak (the high-water mark reset between them); the process's is the largest.
    peak_compile = rss_kb("VmHWM")
    reset_peak()
    start = time.perf_counter()
    trainer = program.trainer()
    load_s = time.perf_counter() - start
    peak_load = rss_kb("VmHWM")
    reset_peak()
    losses, times = [], []
    for _ in range(spec["steps"] + 1):
        start = time.perf_counter()
        losses.append(trainer.step(inputs, target))
        times.append(time.perf_counter() - start)
    peak_steps = rss_kb("VmHWM")
    return {
        "compile_s": compile_s,
        "load_s": load_s,
        "step_s": statistics.median(times[1:]),
        "first_step_s": times[0],
        "losses": losses,
        "peak_mib": max(peak_compile, peak_load, peak_steps) / 1024,
        "peak_compile_mib": peak_compile / 1024,
        "peak_load_mib": peak_load / 1024,
        "peak_steps_mib": peak_steps / 1024,
        # what the device holds: parameters, buffers, optimizer state, its second set, the workspace
        "device_mib": trainer.device_bytes / 2**20,
        "workspace_mib": (trainer.workspace_bytes or 0) / 2**20,
        "backend": program.backend_report(),  # the matmuls' data tiling, vector tails, fusion chosen
    }


def child_torch(spec: dict) -> dict:
    import torch
    import transformers

    from bench.child import with_peft_adapters
    from bench.memory import rss_kb

    arch = ARCHS[spec["arch"]]
    scheme = scheme_dict(arch, spec["scheme"], spec["base"])
    start = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(spec["dir"], dtype=torch.float32)
    if spec["scheme"] == "lora":
        model = with_peft_adapters(scheme, model)
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    else:
        trainable = _trainable(model, scheme)
    load_s = time.perf_counter() - start
    model.train()
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    optimizer = torch.optim.AdamW([p for n, p in model.named_parameters() if n in trainable], **OPTIMIZER)
    inputs, target = _batch(model.config.vocab_size, spec["seq_len"])
    losses, times = [], []
    for _ in range(spec["steps"] + 1):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = _loss(model(**inputs), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - start)
    return {
        "load_s": load_s,
        "step_s": statistics.median(times[1:]),
        "first_step_s": times[0],
        "losses": losses,
        "peak_mib": rss_kb("VmHWM") / 1024,
    }


def child_flops(spec: dict) -> dict:
    """The FLOPs of PyTorch's step of the row's scheme, on the meta device (no memory, no time)."""
    import torch

    from bench.child import with_peft_adapters
    from bench.flops import step_flops

    arch = ARCHS[spec["arch"]]
    scheme = scheme_dict(arch, spec["scheme"], spec["base"])
    if isinstance(scheme, dict):
        scheme = {k: v for k, v in scheme.items() if k != "quantize"}  # the base's format moves no FLOP
    model = _meta_model(spec["dir"])
    if spec["scheme"] == "lora":
        model = with_peft_adapters(scheme, model).to_empty(device="meta")
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    else:
        trainable = _trainable(model, scheme or "full")
    for name, p in model.named_parameters():
        p.requires_grad_(name in trainable)
    inputs, target = _batch(model.config.vocab_size, spec["seq_len"])
    inputs = {k: v.to("meta") for k, v in inputs.items()}
    # A 4-D additive mask, which transformers takes as it is: building one reads tensor values, which
    # meta tensors have not. The attention's matmuls are counted the same either way.
    inputs["attention_mask"] = torch.zeros(BATCH, 1, spec["seq_len"], spec["seq_len"], device="meta")

    def run():
        _loss(model(**inputs), target.to("meta")).backward()

    return {
        "flops": step_flops(run),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trainable": sum(p.numel() for n, p in model.named_parameters() if n in trainable),
    }


def child_sgemm(spec: dict) -> dict:
    from bench.child import measure_sgemm

    return measure_sgemm(spec)


CHILDREN = {"pock": child_pock, "torch": child_torch, "flops": child_flops, "sgemm": child_sgemm}


def run_child(kind: str, spec: dict, env: dict | None = None, timeout: float = 7200) -> dict:
    """Run one child in a fresh process: its RESULT, or {"status": what went wrong}."""
    try:
        run = subprocess.run(
            [sys.executable, "-m", "bench.llm_scale", "--child", kind, json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            cwd=ROOT,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"status": f"timed out after {timeout:.0f} s"}
    line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        killed = " (killed: out of memory?)" if run.returncode in (-9, 137) else ""
        return {"status": f"failed{killed}: {tail[:300]}"}
    return {"status": "ok", **json.loads(line.removeprefix("RESULT "))}


def estimated_gib(params: int, trainable: int, base: str) -> float:
    """A row's resident memory, roughly: the frozen base at its format, the trained float32
    parameters with their gradient and AdamW's two moments; PyTorch also holds the checkpoint's
    float32 copy while loading. Activations at batch 1 are small next to these."""
    frozen = params - trainable
    bytes_per = {"fp32": 4.0, "int8": 1.0, "int4": 0.5}[base]
    weights = frozen * bytes_per + trainable * 4 * 4
    return (weights + 1.5 * 2**30) / 2**30


def available_gib() -> float:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) for line in f}
    return info["MemAvailable"] / 2**20


def write_checkpoint(name: str, seq_len: int, directory: Path) -> None:
    import torch
    import transformers

    if (directory / "config.json").exists():
        return
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=directory.parent, prefix=directory.name + ".partial-"))
    torch.manual_seed(0)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(_config(name, seq_len), dtype=torch.bfloat16)
    model = model.to_empty(device="cpu")
    model.tie_weights()  # to_empty leaves the head its own tensor; the file holds the embedding once
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=generator) if p.dim() > 1 else p.fill_(1.0)
    model.save_pretrained(partial)
    del model
    partial.rename(directory)


def markdown(results: dict) -> str:
    machine = results["machine"]
    lines = [
        f"{results['date'][:16]} UTC, {machine['cpu']} ({machine['cpu_id']}), {machine['cores']} cores, "
        f"{machine['memory_gib']:.0f} GiB; sgemm peak {machine['peak_gflops']:.0f} GFLOP/s; seq {results['seq_len']}, "
        f"batch {BATCH}, AdamW. The machine was shared (load average {machine['load_before'][0]:.1f} before, "
        f"{machine['load_after'][0]:.1f} after): compare the rows of one model, run one after the other.",
        "",
        "| model | scheme | base | system | compile cold s | compile cached s | peak GiB | step s "
        "| tokens/s | % of sgemm peak | vs PyTorch+PEFT LoRA |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in results["rows"]:
        title = ARCHS[row["arch"]]["title"]
        head = f"| {title} | {row['scheme']} | {row['base']} | {row['system']} |"
        if row["status"] != "ok":
            lines.append(head + f" {row['status']} |||||||")
            continue

        def num(key, digits, row=row):
            return f"{row[key]:.{digits}f}" if row.get(key) is not None else ""

        lines.append(
            head + f" {num('compile_s', 0)} | {num('compile_cached_s', 0)} | {row['peak_mib'] / 1024:.2f} "
            f"| {row['step_s']:.2f} | {num('tokens_per_s', 1)} | {num('peak_percent', 1)} | {num('vs_peft', 2)} |"
        )
    return "\n".join(lines + ["", *targets(results["rows"])]) + "\n"


# Issue #62's memory targets on a 24 GB, 2-core machine: (arch, schemes, base, GiB).
PEAK_TARGETS = [
    ("7b", ("sparse", "lora"), "int4", 12.0),
    ("7b", ("sparse", "lora"), "int8", 16.0),
    ("1b", ("sparse", "lora"), "int4", 3.0),  # the 3 GB is the 1B's over int4, as 12 GB is the 7B's
]


def _verdict(value: float, limit: float, unit: str, below: bool) -> str:
    if value <= limit if below else value >= limit:
        return f"met ({value:.2f} {unit})"
    return f"**missed by {abs(value - limit):.2f} {unit}** ({value:.2f} {unit})"


def _where(row: dict) -> str:
    """Where a pock-mlir row's memory went: each phase's peak, and the device's share of the steps'."""
    gib = {k: row[k] / 1024 for k in ("peak_compile_mib", "peak_load_mib", "peak_steps_mib", "device_mib") if k in row}
    text = f"compiling from the cache peaked at {gib['peak_compile_mib']:.2f} GiB"
    if "peak_steps_mib" in row:  # (runs before the phases were reported have the compile's alone)
        text += (
            f", loading the Trainer at {gib['peak_load_mib']:.2f}, the steps at {gib['peak_steps_mib']:.2f} (the "
            f"device's {gib['device_mib']:.2f}, of which {row['workspace_mib'] / 1024:.2f} workspace)"
        )
    return text + f", the cold process at {row['peak_cold_mib'] / 1024:.2f}"


def targets(rows: list) -> list[str]:
    """Each of issue #62's targets against the pock-mlir rows: met, or missed by how much (with where
    the memory went: compiling's peak against the steps'); a target whose row did not run says so."""
    ok = {(r["arch"], r["scheme"], r["base"], r["system"]): r for r in rows if r["status"] == "ok"}
    ran = {(r["arch"], r["scheme"], r["base"]): r["status"] for r in rows if r["system"] == "pock-mlir"}
    lines = ["Targets:", ""]
    for arch, schemes, base, limit in PEAK_TARGETS:
        for scheme in schemes:
            row = ok.get((arch, scheme, base, "pock-mlir"))
            what = f"- {ARCHS[arch]['title']}, {scheme} over {base}, peak under {limit:.0f} GiB: "
            if row is None:
                lines.append(what + ran.get((arch, scheme, base), "not run"))
                continue
            lines.append(what + _verdict(row["peak_mib"] / 1024, limit, "GiB", True) + "; " + _where(row))
    compiled = [r for r in rows if r["arch"] == "7b" and r["system"] == "pock-mlir" and r["status"] == "ok"]
    row = max(compiled, key=lambda r: r["compile_s"], default=None)  # the slowest row's, not the first's
    cold = (
        _verdict(row["compile_s"] / 60, 5.0, "min", True) + f" (the slowest row, {row['scheme']} over {row['base']})"
        if row
        else "not run"
    )
    lines.append(f"- {ARCHS['7b']['title']}, compile under 5 minutes cold: {cold}")
    for base in BASES:
        row = ok.get(("1b", "sparse", base, "pock-mlir"))
        if row is None:
            continue
        head = f"- {ARCHS['1b']['title']}, sparse over {base}, "
        peft = _verdict(row["vs_peft"], 2.0, "x", False) if "vs_peft" in row else "PyTorch + PEFT's row did not run"
        lines.append(head + f"at least 2x PyTorch + PEFT LoRA's tokens/s: {peft}")
        lines.append(head + "at least 50% of the sgemm peak: " + _verdict(row["peak_percent"], 50.0, "%", False))
    return lines


def write_results(out: Path, rows: list, machine: dict, load_before, args) -> None:
    """llm_scale.json and .md in `out`, rewritten after each row so a run cut short keeps its rows."""
    from bench.__main__ import _cpu_name
    from pock_mlir.files import atomic_write
    from pock_mlir.tuning import host_cpu

    peft = {r["arch"]: r["tokens_per_s"] for r in rows if r["system"] == "pytorch+peft" and r["status"] == "ok"}
    for row in rows:
        if row["status"] == "ok" and row["arch"] in peft:
            row["vs_peft"] = row["tokens_per_s"] / peft[row["arch"]]
    results = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpu": _cpu_name(),
            "cpu_id": host_cpu(),
            "cores": os.cpu_count(),
            "memory_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30,
            "python": platform.python_version(),
            "load_before": load_before,
            "load_after": os.getloadavg(),
            **{k: v for k, v in machine.items() if k != "status"},
        },
        "seq_len": args.seq_len,
        "steps": args.steps,
        "rows": rows,
    }
    atomic_write(out / "llm_scale.json", json.dumps(results, indent=2) + "\n")
    atomic_write(out / "llm_scale.md", markdown(results))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llm_scale", description=__doc__.split("\n")[0])
    parser.add_argument("--arch", nargs="+", choices=sorted(ARCHS), default=["1b"])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(DEFAULT_ROWS))
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--checkpoints", default=str(Path(tempfile.gettempdir()) / "pock-llm-scale"))
    parser.add_argument("--out", default=None, help="directory for llm_scale.json and .md")
    parser.add_argument("--markdown", metavar="JSON", help="only rewrite llm_scale.md beside an earlier run's JSON")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.markdown:
        from pock_mlir.files import atomic_write

        path = Path(args.markdown)
        atomic_write(path.with_suffix(".md"), markdown(json.loads(path.read_text())))
        return 0
    if args.child:
        print("RESULT " + json.dumps(CHILDREN[args.child[0]](json.loads(args.child[1]))), flush=True)
        return 0
    out = Path(args.out) if args.out else runs_dir()
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    machine = run_child("sgemm", {"size": 2048})
    print(f"sgemm peak {machine['peak_gflops']:.0f} GFLOP/s, load {load_before[0]:.1f}", flush=True)
    rows = []
    for name in args.arch:
        directory = Path(args.checkpoints) / f"{name}-seq{args.seq_len}"
        write_checkpoint(name, args.seq_len, directory)
        for label in args.rows:
            scheme, base = label.split("-")
            spec = {
                "arch": name,
                "scheme": scheme,
                "base": base,
                "dir": str(directory),
                "seq_len": args.seq_len,
                "steps": args.steps,
            }
            counted = run_child("flops", spec)
            systems = ["pock-mlir"]
            if base == "fp32" and scheme in ("lora", "full"):
                systems.append("pytorch+peft" if scheme == "lora" else "pytorch")
            for system in systems:
                row = {"arch": name, "scheme": scheme, "base": base, "system": system}
                need = estimated_gib(counted["parameters"], counted["trainable"], base)
                if system != "pock-mlir":
                    need += counted["parameters"] * 4 / 2**30 * (2 if scheme == "full" else 0)  # gradients
                free = available_gib()
                if need > free:
                    rows.append({**row, "status": f"does not fit: needs ~{need:.1f} GiB, {free:.1f} GiB free"})
                    print(f"{name} {label} {system}: {rows[-1]['status']}", flush=True)
                    write_results(out, rows, machine, load_before, args)
                    continue
                if system == "pock-mlir":
                    with tempfile.TemporaryDirectory(prefix="pock-llm-cache-") as cache:
                        env = {"POCK_MLIR_CACHE_DIR": cache}
                        cold = run_child("pock", spec, env)
                        cached = run_child("pock", spec, env) if cold["status"] == "ok" else cold
                    result = {**cached, "compile_cached_s": cached.get("compile_s"), "compile_s": cold.get("compile_s")}
                    result["peak_cold_mib"] = cold.get("peak_mib")
                    result["step_cold_s"] = cold.get("step_s")
                else:
                    result = run_child("torch", spec)
                row.update(result)
                if row["status"] == "ok":
                    row["flops"] = counted["flops"]
                    row["tokens_per_s"] = BATCH * args.seq_len / row["step_s"]
                    row["peak_percent"] = 100 * counted["flops"] / row["step_s"] / 1e9 / machine["peak_gflops"]
                rows.append(row)
                write_results(out, rows, machine, load_before, args)
                print(
                    f"{name} {label} {system}: " + json.dumps({k: v for k, v in row.items() if k != "losses"}),
                    flush=True,
                )
    print(f"wrote {out / 'llm_scale.json'} and llm_scale.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
