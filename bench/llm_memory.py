"""Peak host memory of fine-tuning a decoder from a Hugging Face checkpoint, two ways side by side.

    python -m bench.llm_memory [--hidden 2048] [--layers 4] [--seq-len 64] [--steps 2] [--out FILE.json]

It writes a random LLaMA-shaped decoder (about 270 M parameters by default) as a bfloat16 Hugging
Face checkpoint (save_pretrained), then in a fresh process each: (materialized) the model loaded
with from_pretrained in float32 and compiled with compile_training(model, ...), as before weights=;
(weights=) the model built on the meta device and compiled with compile_training(..., weights=DIR).
Each process compiles, makes a Trainer, runs --steps steps and reports its peak resident set (the
kernel's high-water mark, VmHWM; bench/memory.py) after each phase, from the start of the process
(imports included, the same in both), and the float32 parameters' size for scale. The two programs
train the same scheme (the last block's MLP and the final norm); compiling is the compile cache's
once the first has run.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ("materialized", "weights=")


def _config(args):
    import transformers

    return transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 11 // 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 256,
        max_position_embeddings=args.seq_len,
        use_cache=False,
        tie_word_embeddings=True,
    )


def _child(mode: str, directory: str, seq_len: int, steps: int, layers: int) -> dict:
    import torch
    import torch.nn.functional as F
    import transformers

    import pock_mlir as pock
    from bench.memory import rss_kb

    peaks = {"imports": rss_kb("VmHWM")}
    if mode == "materialized":
        model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
        weights = None
    else:
        config = transformers.AutoConfig.from_pretrained(directory)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        weights = directory
    model.train()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (1, seq_len + 1), generator=generator)
    inputs, target = {"input_ids": ids[:, :-1]}, ids[:, 1:]

    def loss(output, y):
        return F.cross_entropy(output.logits.flatten(0, 1), y.flatten())

    sparse = {f"model.layers.{layers - 1}.mlp": "full", "model.norm": "full"}
    program = pock.compile_training(
        model, inputs, target, loss=loss, optimizer=pock.SGD(lr=1e-3), sparse=sparse, weights=weights
    )
    peaks["compile"] = rss_kb("VmHWM")
    trainer = program.trainer()
    peaks["trainer"] = rss_kb("VmHWM")
    losses = [trainer.step(inputs, target) for _ in range(steps)]
    peaks["steps"] = rss_kb("VmHWM")
    parameters = sum(p.numel() for p in model.parameters())
    return {"mode": mode, "peak_kib": peaks, "losses": losses, "parameters": parameters, "rss_kib": rss_kb()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.llm_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the results as JSON here too")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(_child(*args.child, args.seq_len, args.steps, args.layers)), flush=True)
        return 0

    import torch
    import transformers

    with tempfile.TemporaryDirectory() as directory:
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(_config(args)).to(torch.bfloat16).save_pretrained(directory)
        common = ["--seq-len", str(args.seq_len), "--steps", str(args.steps), "--layers", str(args.layers)]
        results = []
        for mode in MODES:
            run = subprocess.run(
                [sys.executable, "-m", "bench.llm_memory", *common, "--child", mode, directory],
                capture_output=True,
                text=True,
                check=False,
            )
            line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(run.stderr[-3000:], file=sys.stderr)
                return 1
            results.append(json.loads(line.removeprefix("RESULT ")))
    parameters = results[0]["parameters"]
    print(f"{parameters / 1e6:.0f} M parameters ({parameters * 4 / 2**30:.2f} GiB in float32), {platform.node()}")
    print(f"{'peak resident set (GiB) after':<32}" + "".join(f"{m:>14}" for m in MODES) + f"{'ratio':>8}")
    for phase in results[0]["peak_kib"]:
        values = [r["peak_kib"][phase] / 2**20 for r in results]
        print(f"  {phase:<30}" + "".join(f"{v:>14.2f}" for v in values) + f"{values[0] / values[1]:>8.2f}")
    print("losses: " + "; ".join(f"{r['mode']} {', '.join(f'{x:.4f}' for x in r['losses'])}" for r in results))
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": platform.node(), "results": results}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
