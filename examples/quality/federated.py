"""Federated fine-tuning on Flower: sparse FedAvg against full-model FedAvg and centralised training.

The vision task of examples/quality/vision.py (a MobileNetV2-like CNN pretrained in PyTorch on
digits 0-4, fine-tuned on digits 5-9 with a fresh head) split across CLIENTS devices by label
(each holds two shards of the training split sorted by digit, so most see two or three of the
five classes: not IID). Each scheme is compiled once into a bundle, at the learning rate the
vision sweep chose for it (examples/quality/results/vision.json), and trained three ways:
federated with FedAvg on Flower's Deployment Engine (a SuperLink and one SuperNode per client on
127.0.0.1, started by pock_mlir.federated.launch as pock-federate does), and centralised on the
union of the clients' data for as many epochs as a client trains in all. "sparse" sends only the
tensors the scheme trains; "full" every parameter. Accuracy is on the vision task's test split,
after every round (the server's evaluation) or epoch (centralised). Writes JSON and a Markdown
table; deterministic data and splits for a seed (FedAvg's timing is not, nor its float sums).
--quick (2 clients, 2 rounds, vision.py --quick's smaller network) trains the sparse scheme alone:
the full one takes the same path with a larger bundle, and would double the smoke run.

    python examples/quality/federated.py [--quick] [--out examples/quality/results] [--work DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import pock_mlir as pock  # noqa: E402
from examples.quality.cli import RESULTS, add_output_options, output_directory  # noqa: E402
from examples.quality.vision import BATCH, SCHEMES, fresh_head, images, pretrain  # noqa: E402
from pock_mlir.bundle import write_bundle  # noqa: E402
from pock_mlir.data import Split, batch_order, evaluate  # noqa: E402
from pock_mlir.federated.launch import LocalFederation, finished  # noqa: E402
from pock_mlir.files import atomic_save, atomic_write  # noqa: E402
from pock_mlir.runtime import Trainer  # noqa: E402

CLIENTS = 4
SHARDS_PER_CLIENT = 2
COMPARED = {"sparse": "sparse preset", "full": "full"}  # this script's name -> the vision scheme
QUICK_COMPARED = ("sparse",)


def learning_rates(names) -> dict[str, float]:
    chosen = json.loads((RESULTS / "vision.json").read_text())["results"]
    return {name: chosen[COMPARED[name]]["lr"] for name in names}


def label_shards(y: np.ndarray, clients: int, seed: int) -> list[np.ndarray]:
    """Sample indices per client: the split sorted by label, cut into clients x SHARDS_PER_CLIENT
    shards, each client given SHARDS_PER_CLIENT of them at random (McMahan et al.'s non-IID split)."""
    order = np.argsort(y, kind="stable")
    shards = np.array_split(order, clients * SHARDS_PER_CLIENT)
    picks = np.random.default_rng(seed).permutation(len(shards)).reshape(clients, SHARDS_PER_CLIENT)
    return [np.concatenate([shards[i] for i in pick]) for pick in picks]


def write_data(work: Path, clients: int, seed: int) -> tuple[list[Path], Path, dict]:
    data = images(seed)
    (x, y), (x_test, y_test) = data["train"], data["test"]
    (work / "data").mkdir(parents=True, exist_ok=True)
    files = []
    for index, part in enumerate(label_shards(y, clients, seed)):
        files.append(work / "data" / f"client-{index}.npz")
        atomic_save(files[-1], lambda f, part=part: np.savez(f, x_train=x[part], y_train=y[part]))
        print(f"client {index}: {len(part)} samples, digits {sorted(set((y[part] + 5).tolist()))}", flush=True)
    test = work / "data" / "test.npz"
    atomic_save(test, lambda f: np.savez(f, x_val=x_test, y_val=y_test))
    return files, test, data


def compile_bundle(name: str, lr: float, checkpoint: Path, seed: int, x, y, work: Path) -> Path:
    model = fresh_head(checkpoint, seed)
    program = pock.compile_training(
        model,
        x[:BATCH],
        y[:BATCH],
        loss="cross_entropy",
        optimizer=pock.SGD(lr=lr, momentum=0.9),
        sparse=SCHEMES[COMPARED[name]],
        functions="all",
    )
    return write_bundle(
        program, work / "bundles" / name, example_inputs=x[:BATCH], example_target=y[:BATCH], loss="cross_entropy"
    )


def federate(name: str, bundle: Path, clients: list[Path], test: Path, rounds: int, epochs: int, work: Path) -> dict:
    out = work / f"run-{name}"
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "bundle": str(bundle),
        "test-data": str(test),
        "out": str(out),
        "num-server-rounds": rounds,
        "local-epochs": epochs,
        "clients": len(clients),
        "min-clients": len(clients),
    }
    started = time.perf_counter()
    with LocalFederation([(bundle, data) for data in clients], out) as federation:
        code = federation.run(config, show=lambda line: print(f"  [{name} FedAvg] {line}", flush=True))
    if code != 0 or not finished(out):
        raise SystemExit(f"the {name} federation did not finish: see {out / 'flower.log'}")
    results = json.loads((out / "federated.json").read_text())
    results["seconds"] = time.perf_counter() - started
    return results


def centralised(bundle: Path, data: dict, epochs: int, seed: int) -> list[float]:
    """Test accuracy after each epoch of training the bundle on the union of the clients' data."""
    (x, y), (x_test, y_test) = data["train"], data["test"]
    trainer, test = Trainer.from_bundle(bundle), Split([x_test], y_test)
    accuracies = []
    for epoch in range(epochs):
        for batch in batch_order(seed, epoch, len(y), BATCH):
            trainer.step(x[batch], y[batch])
        accuracies.append(evaluate(trainer, test, BATCH)["val_accuracy"])
    return accuracies


def markdown(results: dict) -> str:
    rounds, compared = results["rounds"], list(results["federated"])
    rows = [
        "| scheme | training | tensors sent | bytes per round (to clients + from clients) | "
        f"test accuracy after {rounds} rounds (epochs) |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name in compared:
        run = results["federated"][name]
        last = run["rounds"][-1]
        per_round = last["bytes_to_clients"] + last["bytes_from_clients"]
        rows.append(
            f"| {name} | FedAvg, {results['clients']} clients | {run['wire_tensors']} of "
            f"{results['parameters']} | {per_round:,} | {last['val_accuracy']:.3f} |"
        )
    for name in compared:
        rows.append(f"| {name} | centralised, union of the data | - | - | {results['centralised'][name][-1]:.3f} |")
    rows += [
        "",
        "| round | "
        + " | ".join(f"{name} FedAvg | {name} bytes" for name in compared)
        + " | "
        + " | ".join(f"{name} centralised" for name in compared)
        + " |",
        "| ---: |" + " ---: |" * (3 * len(compared)),
    ]
    for r in range(rounds + 1):
        cells = []
        for name in compared:
            row = results["federated"][name]["rounds"][r]
            cells += [
                f"{row['val_accuracy']:.3f}",
                f"{row['bytes_to_clients'] + row['bytes_from_clients']:,}" if r else "-",
            ]
        epoch = r * results["local_epochs"]  # as many as a client has trained after round r
        cells += [f"{results['centralised'][name][epoch - 1]:.3f}" if r else "-" for name in compared]
        rows.append(f"| {r} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_output_options(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--work",
        help="keep the bundles, client data and Flower runs here (default: a temporary directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    out = output_directory(parser, args)
    out.mkdir(parents=True, exist_ok=True)
    pretrain_epochs, clients, rounds, epochs = (2, 2, 2, 2) if args.quick else (12, CLIENTS, 10, 5)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="pock-federated-"))
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    try:
        pretrain(args.seed, pretrain_epochs, work / "pretrained.pt", args.quick)
        files, test, data = write_data(work, clients, args.seed)
        x, y = data["train"]
        lrs = learning_rates(QUICK_COMPARED if args.quick else COMPARED)
        bundles = {
            name: compile_bundle(name, lr, work / "pretrained.pt", args.seed, x, y, work) for name, lr in lrs.items()
        }
        # every parameter, trained or frozen (the manifest lists them all)
        parameters = len(json.loads((bundles["sparse"] / "manifest.json").read_text())["params"])
        results = {
            "seed": args.seed,
            "clients": clients,
            "rounds": rounds,
            "local_epochs": epochs,
            "learning_rates": lrs,
            "parameters": parameters,
            "federated": {},
            "centralised": {},
        }
        for name, bundle in bundles.items():
            print(
                f"{name} FedAvg: {clients} clients, {rounds} rounds of {epochs} local epoch(s), lr {lrs[name]:g}",
                flush=True,
            )
            results["federated"][name] = federate(name, bundle, files, test, rounds, epochs, work)
            results["centralised"][name] = centralised(bundle, data, rounds * epochs, args.seed)
            print(
                f"{name} centralised: test accuracy {results['centralised'][name][-1]:.3f} after "
                f"{rounds * epochs} epochs",
                flush=True,
            )
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    table = markdown(results)
    print(table)
    atomic_write(out / "federated.json", json.dumps(results, indent=1) + "\n")
    atomic_write(out / "federated.md", table + "\n")


if __name__ == "__main__":
    main()
