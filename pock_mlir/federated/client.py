"""The Flower ClientApp: one device trains its bundle on its own data and sends what it trained.

Each SuperNode names its bundle and data in its node config (flower-supernode --node-config
'bundle="DIR" data="FILE.npz"'). A train message carries the global trainable tensors
(pock_mlir.federated.wire) and the server bundle's module sha256; the client refuses a message
for another module, loads its bundle with the torch-free Trainer, writes the tensors in, trains
local epochs over its data exactly as pock-train reads and orders it, and replies with the
trained tensors, the examples it trained on and its metrics.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from safetensors.numpy import save

from pock_mlir.data import batch_order, evaluate, load_data
from pock_mlir.federated.wire import from_wire, to_wire
from pock_mlir.files import atomic_write
from pock_mlir.runtime import NonFiniteLossError
from pock_mlir.runtime.bundle import Bundle, load_bundle
from pock_mlir.tools.pock_train import open_trainer

app = ClientApp()


class BundleMismatchError(ValueError):
    """The server trains another module than this device's bundle."""


def arrays_of(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


def record_of(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({name: Array(array) for name, array in arrays.items()})


def _open_bundle(context: Context, config) -> Bundle:
    bundle = load_bundle(context.node_config["bundle"])
    if bundle.module_sha256 != config["module-sha256"]:
        raise BundleMismatchError(
            f"this device's bundle {bundle.path} has module sha256 {bundle.module_sha256[:12]}…, the server trains "
            f"{str(config['module-sha256'])[:12]}…: give this SuperNode the bundle the server was started with"
        )
    return bundle


@app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    bundle = _open_bundle(context, config)
    train_split, val_split = load_data(context.node_config["data"], bundle)
    trainer = open_trainer(bundle, bundle.driver, "stop")
    trainer.load_state_dict(from_wire(bundle, trainer.state_dict(), arrays_of(msg.content["arrays"])), strict=False)
    server_round, epochs = int(config["server-round"]), int(config["local-epochs"])
    node_seed = int(context.node_config.get("seed", 0))
    losses, started = [], time.perf_counter()
    for epoch in range(epochs):
        # A fresh order per round and epoch, drawn as pock-train draws it from (seed, epoch).
        for step, batch in enumerate(
            batch_order(node_seed, server_round * epochs + epoch, len(train_split), bundle.batch_size)
        ):
            try:
                losses.append(trainer.step(*train_split.batch(batch)))
            except NonFiniteLossError as e:
                raise NonFiniteLossError(
                    f"round {server_round}, local epoch {epoch + 1}, batch {step + 1}: {e}"
                ) from None
    sent = to_wire(bundle, trainer.state_dict())
    if "sent-log" in context.node_config:  # an audit copy of exactly what this reply carries
        atomic_write(Path(context.node_config["sent-log"]) / f"round-{server_round}.safetensors", save(sent))
    metrics = {
        "num-examples": len(losses) * bundle.batch_size,
        "train-loss": float(np.mean(losses)),
        "train-seconds": time.perf_counter() - started,
    }
    if val_split is not None:
        metrics.update(
            {key.replace("_", "-"): value for key, value in evaluate(trainer, val_split, bundle.batch_size).items()}
        )
    return Message(RecordDict({"arrays": record_of(sent), "metrics": MetricRecord(metrics)}), reply_to=msg)
