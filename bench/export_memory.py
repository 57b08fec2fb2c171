"""The host memory that writing a checkpoint, resuming from one and export_pretrained take, as
multiples of the model's bytes: each streams tensor by tensor, so none should hold a second copy
of the model (or its optimizer state) on the host.

    python -m bench.export_memory [--hidden 512] [--layers 4] [--vocab 2048]

A Hugging Face LLaMA trained by AdamW (two state slots a parameter) on the CPU; for each operation,
the peak of the host allocations Python and numpy make (tracemalloc: what the operation copies
to the host; the device's own buffers and the file pages a checkpoint maps are not allocations).
The resident set is not the measure here: a Trainer keeps freed memory mapped for reuse
(pock_mlir/runtime/memory.py), so one operation's peak hides the next one's. Prints one markdown
table; the model's bytes are its float32 parameters, the checkpoint's its file size. The last row
writes the same state_dict file as pock-train --export does, from a dict held whole (as it did
before it streamed), for comparison.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import tracemalloc
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors.numpy import save

import pock_mlir as pock
from pock_mlir.checkpoint import load_checkpoint, save_checkpoint
from pock_mlir.files import atomic_write
from pock_mlir.tools.pock_train import export_state_dict


def next_token_loss(out, y):
    return F.cross_entropy(out.logits.flatten(0, 1), y.flatten())


def measure(operation) -> int:
    """The peak of the bytes Python and numpy allocate during operation()."""
    gc.collect()
    tracemalloc.start()
    operation()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


class Resumed:
    """The bundle-less part of a resume: what load_checkpoint needs of a bundle."""

    def __init__(self, signature, module_sha256):
        self.signature, self.module_sha256 = signature, module_sha256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(0, args.vocab, (1, 17))
    x, y = ids[:, :-1], ids[:, 1:]
    program = pock.compile_training(model, x, y, loss=next_token_loss, optimizer=pock.AdamW(lr=1e-3))
    model_bytes = sum(p.numel() * 4 for p in model.parameters())
    del model
    trainer = program.trainer()
    del program
    trainer.step(x, y)
    with tempfile.TemporaryDirectory() as directory:
        checkpoint = Path(directory) / "run.ckpt"
        bundle = Resumed(trainer.signature, "bench")
        rows = {
            "save_checkpoint": measure(lambda: save_checkpoint(checkpoint, trainer, {}, "bench")),
            "load_checkpoint + load_state_dict + load_optimizer_state": measure(
                lambda: _resume(trainer, load_checkpoint(checkpoint, bundle))
            ),
            "export_pretrained": measure(lambda: trainer.export_pretrained(Path(directory) / "hf")),
            "pock-train --export (export_state_dict)": measure(
                lambda: export_state_dict(trainer, Path(directory) / "tuned.safetensors")
            ),
            "for comparison, whole: save(merged_state_dict())": measure(
                lambda: atomic_write(Path(directory) / "old.safetensors", save(trainer.merged_state_dict()))
            ),
        }
        checkpoint_bytes = os.path.getsize(checkpoint)
    print(
        f"LLaMA hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}: model {model_bytes / 1e6:.1f} MB "
        f"(float32), checkpoint {checkpoint_bytes / 1e6:.1f} MB\n"
    )
    print("| operation | host copies (tracemalloc peak) | x model |")
    print("|---|---|---|")
    for name, traced in rows.items():
        print(f"| {name} | {traced / 1e6:.1f} MB | {traced / model_bytes:.2f} |")


def _resume(trainer, checkpoint) -> None:
    trainer.load_state_dict(checkpoint.state_dict)
    trainer.load_optimizer_state(checkpoint.optimizer_state)


if __name__ == "__main__":
    main()
