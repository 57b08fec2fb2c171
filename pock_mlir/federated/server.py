"""The Flower ServerApp: FedAvg (or FedAdam) over the tensors a bundle trains.

The run config (pock_mlir/federated/flower_app/pyproject.toml lists every key and its default)
names the server's bundle, its held-out data and an output directory. The strategy starts from
the bundle's parameters, sends each round only the trainable tensors (pock_mlir.federated.wire)
with the bundle's module sha256, refuses replies that are errors or carry other tensors (saying
which node and why), aggregates the rest weighted by the examples each trained on, and evaluates
the global model on the held-out data with the server's own Trainer. After every round it writes
OUT/federated.json (accuracy, loss, bytes each way); at the end the global model as a PyTorch
state_dict (OUT/global.safetensors, as pock-train --export writes) and as a bundle (OUT/bundle).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Message, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAdam, FedAvg
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

from pock_mlir.bundle import write_trained_bundle
from pock_mlir.data import DataError, evaluate, load_data
from pock_mlir.federated.client import arrays_of, record_of
from pock_mlir.federated.wire import WireError, check_wire, from_wire, in_bundle_dtypes, to_wire, wire_bytes
from pock_mlir.files import atomic_write
from pock_mlir.runtime import InputError
from pock_mlir.runtime.bundle import Bundle, BundleError, load_bundle
from pock_mlir.tools.pock_train import export_state_dict, open_trainer

app = ServerApp()
SAY = "[pock]"  # prefixes the lines pock-federate shows (the rest of Flower's log goes to its log file)
RESULTS, EXPORT, BUNDLE = "federated.json", "global.safetensors", "bundle"
ERROR_REASON = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>:<'(.*)'>", re.S)  # how Flower reports a ClientApp's exception


def say(text: str) -> None:
    print(f"{SAY} {text}", flush=True)


def message_bytes(message: Message) -> int:
    """What Flower transfers for `message`: the serialized bytes of every object in its tree
    (the message, its records, each array and its chunks)."""
    return sum(len(obj.deflate()) for obj in get_all_nested_objects(message).values())


def explain(reply: Message) -> str:
    match = ERROR_REASON.fullmatch(reply.error.reason or "")
    return f"{match.group(1)}: {match.group(2)}" if match else reply.error.reason


class WireAccounting:
    """Counts the bytes of every round's messages and keeps out replies that cannot be
    aggregated, naming the node and the reason; the strategy it is mixed into aggregates the rest."""

    def __init__(self, *args, bundle: Bundle, **kwargs):
        super().__init__(*args, **kwargs)
        self.bundle, self.rounds = bundle, {}

    def configure_train(self, server_round, arrays, config, grid):
        arrays = record_of(in_bundle_dtypes(self.bundle, arrays_of(arrays)))
        messages = list(super().configure_train(server_round, arrays, config, grid))
        self.rounds[server_round] = {
            "round": server_round,
            "clients": len(messages),
            "bytes_to_clients": sum(message_bytes(m) for m in messages),
        }
        return messages

    def aggregate_train(self, server_round, replies):
        accepted, refused = [], []
        for reply in replies:
            node = reply.metadata.src_node_id
            if reply.has_error():
                refused.append(f"node {node}: {explain(reply)}")
                continue
            try:
                check_wire(self.bundle, arrays_of(reply.content["arrays"]))
            except (WireError, KeyError) as e:
                refused.append(f"node {node} sent tensors this bundle does not train ({e}); refused")
                continue
            accepted.append(reply)
        this_round = self.rounds[server_round]
        this_round.update(
            replies=len(accepted),
            failures=len(refused),
            bytes_from_clients=sum(message_bytes(m) for m in accepted),
            reply_bytes=[message_bytes(m) for m in accepted],
        )
        for line in refused:
            say(f"round {server_round}: {line}")
        if len(accepted) < self.min_train_nodes:
            say(
                f"round {server_round}: {len(accepted)} replies, fewer than min-clients ({self.min_train_nodes}); "
                f"the global model stays as it was"
            )
            return None, None
        return super().aggregate_train(server_round, accepted)


class PockFedAvg(WireAccounting, FedAvg):
    pass


class PockFedAdam(WireAccounting, FedAdam):
    pass


STRATEGIES = {"fedavg": PockFedAvg, "fedadam": PockFedAdam}


def _wait_for_clients(grid: Grid, clients: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while (connected := len(list(grid.get_node_ids()))) < clients:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{connected} of {clients} SuperNodes connected within {seconds:.0f} s; "
                f"start the missing ones or lower the run config's clients"
            )
        time.sleep(0.5)


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        federate(grid, context.run_config)
    except (BundleError, DataError, InputError, OSError, ValueError, RuntimeError) as e:
        say(f"error: {e}")  # one line for pock-federate; Flower logs the traceback
        raise


def federate(grid: Grid, run) -> None:
    bundle = load_bundle(run["bundle"])
    _, held_out = load_data(run["test-data"], bundle, need_train=False)
    if held_out is None:
        raise DataError(f"{run['test-data']} holds no held-out split (x_val, y_val) for the server to evaluate on")
    out = Path(run["out"])
    out.mkdir(parents=True, exist_ok=True)
    evaluator = open_trainer(bundle, bundle.driver, "stop")
    strategy_name = str(run["strategy"])
    if strategy_name not in STRATEGIES:
        raise ValueError(f"strategy {strategy_name!r}: choose one of {', '.join(STRATEGIES)}")
    minimum = int(run["min-clients"])
    options = {"eta": float(run["server-lr"])} if strategy_name == "fedadam" else {}
    strategy = STRATEGIES[strategy_name](
        bundle=bundle, fraction_evaluate=0.0, min_train_nodes=minimum, min_available_nodes=minimum, **options
    )
    initial = to_wire(bundle, {**bundle.initial_params, **bundle.initial_buffers})
    results = {
        "strategy": strategy_name,
        "bundle": str(bundle.path),
        "module_sha256": bundle.module_sha256,
        "wire_tensors": len(initial),
        "wire_payload_bytes": wire_bytes(bundle),
        "model_bytes": sum(a.nbytes for a in {**bundle.initial_params, **bundle.initial_buffers}.values()),
        "rounds": [],
        "finished": False,
    }
    say(
        f"{strategy_name}: {len(initial)} tensors cross the wire ({results['wire_payload_bytes']:,} of "
        f"{results['model_bytes']:,} bytes of parameters and buffers)"
    )

    def evaluate_global(server_round: int, arrays) -> MetricRecord:
        evaluator.load_state_dict(from_wire(bundle, evaluator.state_dict(), arrays_of(arrays)), strict=False)
        metrics = evaluate(evaluator, held_out, bundle.batch_size)
        row = {**strategy.rounds.get(server_round, {"round": 0}), **metrics}
        results["rounds"].append(row)
        atomic_write(out / RESULTS, json.dumps(results, indent=1) + "\n")
        traffic = (
            f", {row['replies']}/{row['clients']} clients replied, {row['bytes_to_clients']:,} B sent to "
            f"clients, {row['bytes_from_clients']:,} B received"
            if server_round
            else ""
        )
        say(
            f"round {server_round}/{run['num-server-rounds']}: accuracy {metrics.get('val_accuracy', float('nan')):.4f}, "
            f"loss {metrics['val_loss']:.4f}{traffic}"
        )
        return MetricRecord(metrics)

    _wait_for_clients(grid, int(run["clients"]), float(run["connect-timeout"]))
    result = strategy.start(
        grid=grid,
        initial_arrays=record_of(initial),
        num_rounds=int(run["num-server-rounds"]),
        timeout=float(run["round-timeout"]),
        evaluate_fn=evaluate_global,
        train_config=_train_config(run, bundle),
    )
    # result.arrays is empty when no round aggregated anything: the global model is then the bundle's
    final = from_wire(bundle, evaluator.state_dict(), arrays_of(result.arrays) if len(result.arrays) else initial)
    evaluator.load_state_dict(final, strict=False)
    state = evaluator.state_dict()
    export_state_dict(evaluator, out / EXPORT)
    write_trained_bundle(bundle, state, out / BUNDLE)
    results["finished"] = True
    atomic_write(out / RESULTS, json.dumps(results, indent=1) + "\n")
    say(f"the global model: {out / EXPORT} (PyTorch state_dict) and {out / BUNDLE} (bundle)")


def _train_config(run, bundle: Bundle) -> ConfigRecord:
    return ConfigRecord({"module-sha256": bundle.module_sha256, "local-epochs": int(run["local-epochs"])})
