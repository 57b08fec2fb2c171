"""pock-mlir as it is deployed: the Trainer of a device bundle, in a process that never imports
torch (the runtime needs numpy and IREE's runtime only). `python -m bench.deployed_child '<json spec>'`
takes the bundle bench/child.py's "pock-compile" task wrote beside the program and speaks the
protocol of bench/child.py, stepping on the bundle's own batch (args/batch, the bench's batch).
Peak memory is over the resident set after importing numpy, IREE's runtime and pock_mlir.runtime.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.protocol import block_torch, memory_facts, print_result, timed_rounds, torch_loaded

block_torch()  # before anything else is imported: this process must run without it

import numpy as np  # noqa: E402

from bench.memory import rss_kb  # noqa: E402
from pock_mlir.runtime import Trainer  # noqa: E402


def run_deployed(spec) -> dict:
    trainer = Trainer.from_bundle(spec["bundle"])  # as a device loads it: the bundle's host copies go
    batch = Path(spec["bundle"]) / "args" / "batch"
    inputs = [np.load(batch / f"{input.name}.npy") for input in trainer.signature.model_inputs]
    target = np.load(batch / "target.npy")
    result = timed_rounds(lambda: trainer.step(inputs, target), spec)
    return {**result, **memory_facts(trainer), "torch_loaded": torch_loaded()}


def main() -> None:
    spec = json.loads(sys.argv[1])
    print_result(lambda: run_deployed(spec), rss_kb())


if __name__ == "__main__":
    main()
