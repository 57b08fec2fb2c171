"""Federated fine-tuning on Flower's Deployment Engine (pock_mlir/federated): real SuperLink and
SuperNode processes on 127.0.0.1 ports that were free, the digits MLP with a frozen layer and a
channel-sparse one. The oracle is numpy: a FedAvg, written here, of the tensors the clients
actually sent (each client keeps an audit copy of its replies), and the tensor sizes the manifest
implies for the message sizes the server measured."""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

pytest.importorskip("flwr", reason="the federated extra (pip install 'pock-mlir[federated]')")

from test_tools import load_example  # noqa: E402

import pock_mlir as pock  # noqa: E402
from pock_mlir.bundle import write_bundle  # noqa: E402
from pock_mlir.federated import launch, wire  # noqa: E402
from pock_mlir.federated.launch import LocalFederation, process_tree  # noqa: E402
from pock_mlir.runtime import Trainer  # noqa: E402
from pock_mlir.runtime.bundle import load_bundle  # noqa: E402

ROUNDS = 2
RUN_SECONDS = 120  # one federation of this file takes 20-40 s on a 2-core machine
SPARSE = {"default": "full", "0": "frozen", "2": 0.25}  # 0: frozen, 2: its first 16 of 64 rows train


def compile_bundle(directory: Path, sparse) -> Path:
    example = load_example()
    inputs, target = example.example_batch()
    program = pock.compile_training(
        example.model(),
        inputs,
        target,
        loss="cross_entropy",
        optimizer=pock.SGD(lr=0.1, momentum=0.9),
        sparse=sparse,
        functions="all",
    )
    return write_bundle(program, directory, example_inputs=inputs, example_target=target, loss="cross_entropy")


@pytest.fixture(scope="session")
def bundles(tmp_path_factory):
    """The sparse digits bundle, and the same model compiled for full training (another module)."""
    root = tmp_path_factory.mktemp("federated-bundles")
    return compile_bundle(root / "sparse", SPARSE), compile_bundle(root / "full", None)


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """Non-IID client files (digits 0-4 and 5-9) and the server's held-out file."""
    root = tmp_path_factory.mktemp("federated-data")
    digits = load_example().load_data()
    x, y = digits["x_train"], digits["y_train"]
    clients = []
    for index, keep in enumerate([y < 5, y >= 5]):
        clients.append(root / f"client-{index}.npz")
        np.savez(clients[-1], x_train=x[keep], y_train=y[keep])
    np.savez(root / "test.npz", x_val=digits["x_val"], y_val=digits["y_val"])
    return clients, root / "test.npz"


def run_config(bundle: Path, test: Path, out: Path, **overrides) -> dict:
    return {
        "bundle": str(bundle),
        "test-data": str(test),
        "out": str(out),
        "num-server-rounds": ROUNDS,
        "local-epochs": 1,
        "clients": 2,
        "min-clients": 2,
        "round-timeout": 60,
        **overrides,
    }


def alive(pids) -> list[int]:
    return [pid for pid in pids if launch._alive(pid)]


class Federation:
    """A LocalFederation whose process trees are recorded while it runs, to check they all end."""

    def __init__(self, clients, work: Path):
        self.local = LocalFederation(clients, work, sent_logs=True)
        self.pids: set[int] = set()
        self.shown: list[str] = []
        self.client_libraries: dict[int, str] = {}  # each ClientApp process's last seen memory map

    def record(self) -> None:
        for process in [self.local.superlink, *self.local.supernodes]:
            if process.poll() is None:
                self.pids.update(process_tree(process.pid))
        for pid in self.pids:
            try:
                if b"flwr-clientapp" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    self.client_libraries[pid] = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                pass  # it has ended

    def run(self, config: dict) -> int:
        with self.local:
            watcher = threading.Thread(target=self._watch, daemon=True)
            self.running = True
            watcher.start()
            try:
                return self.local.run(config, show=self.shown.append, timeout=RUN_SECONDS)
            finally:
                self.running = False
                watcher.join()

    def _watch(self) -> None:
        while self.running:
            self.record()
            time.sleep(0.2)


@pytest.fixture(scope="module")
def federation(bundles, data, tmp_path_factory):
    """Two clients with the server's bundle and a third with the full-training bundle, 2 rounds."""
    (sparse, full), (clients, test) = bundles, data
    work = tmp_path_factory.mktemp("federation")
    fed = Federation([(sparse, clients[0]), (sparse, clients[1]), (full, clients[0])], work)
    code = fed.run(run_config(sparse, test, work, clients=3))
    assert code == 0 and launch.finished(work), "\n".join(fed.shown)
    assert not alive(fed.pids), "Flower processes outlived the federation"
    return fed, work, json.loads((work / "federated.json").read_text())


def examples_trained(data_file: Path, batch: int) -> int:
    return len(np.load(data_file)["y_train"]) // batch * batch


def test_global_model_is_the_numpy_fedavg_of_what_the_clients_sent(federation, bundles, data):
    fed, work, results = federation
    sparse = load_bundle(bundles[0])
    sent = [load_file(fed.local.sent_log(index) / f"round-{ROUNDS}.safetensors") for index in (0, 1)]
    weights = [examples_trained(path, sparse.batch_size) for path in data[0]]
    exported = load_file(work / "global.safetensors")
    for name in sent[0]:
        fedavg = sum(w * s[name].astype(np.float64) for w, s in zip(weights, sent)) / sum(weights)
        rows = len(fedavg)
        np.testing.assert_allclose(exported[name][:rows], fedavg, rtol=1e-6, atol=1e-7, err_msg=name)
        # The rows a channel-sparse layer never trains stay as compiled.
        np.testing.assert_array_equal(exported[name][rows:], sparse.initial_params[name][rows:])
    np.testing.assert_array_equal(exported["0.weight"], sparse.initial_params["0.weight"])
    assert not np.allclose(sent[0]["4.weight"], sent[1]["4.weight"])  # the clients did train apart
    # The global bundle starts from the exported model and trains.
    trainer = Trainer.from_bundle(work / "bundle")
    for name, value in trainer.state_dict().items():
        np.testing.assert_array_equal(value, exported[name])
    assert [row["round"] for row in results["rounds"]] == list(range(ROUNDS + 1))
    assert all(row["replies"] == 2 and row["failures"] == 1 for row in results["rounds"][1:])


def test_frozen_tensors_never_cross_the_wire(federation, bundles):
    fed, _, results = federation
    manifest = json.loads((bundles[0] / "manifest.json").read_text())
    params = {p["name"]: p["shape"] for p in manifest["params"]}
    rows = math.ceil(0.25 * params["2.weight"][0])
    expected = {
        "2.weight": (rows, params["2.weight"][1]),
        "2.bias": (rows,),
        "4.weight": tuple(params["4.weight"]),
        "4.bias": tuple(params["4.bias"]),
    }
    sent = load_file(fed.local.sent_log(0) / "round-1.safetensors")
    assert {name: value.shape for name, value in sent.items()} == expected
    payload = 4 * sum(math.prod(shape) for shape in expected.values())
    frozen = 4 * (
        math.prod(params["0.weight"])
        + math.prod(params["0.bias"])
        + (params["2.weight"][0] - rows) * params["2.weight"][1]
        + params["2.bias"][0]
        - rows
    )
    overhead = 4096  # Flower's message, record and chunk headers, the config and the metrics
    for row in results["rounds"][1:]:
        assert len(row["reply_bytes"]) == 2
        for size in [*row["reply_bytes"], row["bytes_to_clients"] / row["clients"]]:
            assert payload <= size < payload + overhead < frozen, (size, payload, frozen)
    assert results["wire_payload_bytes"] == payload


def test_clients_train_without_torch(federation):
    fed, _, _ = federation
    trained = [pid for pid, maps in fed.client_libraries.items() if "iree/_runtime_libs" in maps]
    assert len(trained) >= 2 * ROUNDS, "too few ClientApp processes were seen with IREE loaded"
    for pid, maps in fed.client_libraries.items():  # some are seen only as they start or end
        assert "libtorch" not in maps, f"ClientApp process {pid} loaded PyTorch"


def test_a_client_with_another_bundle_is_refused_by_name(federation):
    fed, _, _ = federation
    refusals = [line for line in fed.shown if "BundleMismatchError" in line]
    assert len(refusals) == ROUNDS, fed.shown
    assert (
        "has module sha256" in refusals[0]
        and "give this SuperNode the bundle the server was started with" in refusals[0]
    )
    assert "Traceback" not in "\n".join(fed.shown)


def test_a_client_killed_mid_round_does_not_stop_the_run(bundles, data, tmp_path):
    """SuperNode 1 is killed while its ClientApp trains round 2; the round times out waiting for it
    and aggregates the other client's reply alone (min-clients 1), and the run finishes."""
    (sparse, _), (clients, test) = bundles, data
    fed = Federation([(sparse, clients[0]), (sparse, clients[1])], tmp_path)
    killed = []

    def kill_in_round_two():
        deadline = time.monotonic() + RUN_SECONDS
        while time.monotonic() < deadline and not killed:
            if any(line.startswith(f"round 1/{ROUNDS}:") for line in fed.shown):  # round 1 is aggregated
                node = fed.local.supernodes[1]
                apps = [
                    pid
                    for pid in process_tree(node.pid)
                    if b"flwr-clientapp" in Path(f"/proc/{pid}/cmdline").read_bytes()
                ]
                if apps:
                    for pid in process_tree(node.pid):
                        os.kill(pid, signal.SIGKILL)
                    killed.append(apps)
            time.sleep(0.05)

    killer = threading.Thread(target=kill_in_round_two, daemon=True)
    killer.start()
    code = fed.run(run_config(sparse, test, tmp_path, **{"min-clients": 1, "round-timeout": 25}))
    killer.join()
    assert killed, "SuperNode 1 never started round 2's ClientApp"
    assert code == 0 and launch.finished(tmp_path), "\n".join(fed.shown)
    results = json.loads((tmp_path / "federated.json").read_text())
    assert [row.get("replies") for row in results["rounds"][1:]] == [2, 1]
    assert not (fed.local.sent_log(1) / "round-2.safetensors").exists()
    survivor = load_file(fed.local.sent_log(0) / "round-2.safetensors")
    exported = load_file(tmp_path / "global.safetensors")
    for name, value in survivor.items():
        np.testing.assert_allclose(exported[name][: len(value)], value, rtol=1e-6, atol=1e-7)
    assert not alive(fed.pids)


def test_ctrl_c_stops_every_process(bundles, data, tmp_path):
    """pock-federate with FedAdam, interrupted after round 2: its exit, its processes, and FedAdam's
    float64 global tensors sent to the clients in the bundle's float32 (round 2 as large as round 1)."""
    (sparse, _), (clients, test) = bundles, data
    command = [
        sys.executable,
        "-m",
        "pock_mlir.federated.launch",
        str(sparse),
        "--data",
        *map(str, clients),
        "--test-data",
        str(test),
        "--out",
        str(tmp_path / "out"),
        "--rounds",
        "20",
        "--strategy",
        "fedadam",
    ]
    # started with SIGINT ignored, as a non-interactive shell starts a `cmd &` job: Ctrl-C must still stop it
    runner = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    pids: set[int] = set()
    try:
        lines = []
        deadline = time.monotonic() + RUN_SECONDS
        for line in runner.stdout:
            lines.append(line)
            pids.update(process_tree(runner.pid))
            if "round 2/20" in line or time.monotonic() > deadline:
                break
        assert any("round 2/20: accuracy" in line for line in lines), "".join(lines)
        runner.send_signal(signal.SIGINT)
        _, err = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            for pid in process_tree(runner.pid):
                os.kill(pid, signal.SIGKILL)
            runner.wait()
    assert runner.returncode == 130, err
    assert "interrupted; every Flower process it started is stopped" in err and "Traceback" not in err
    assert len(pids) > 5 and not alive(pids)
    results = json.loads((tmp_path / "out" / "federated.json").read_text())
    assert results["strategy"] == "fedadam" and not results["finished"]
    first, second = results["rounds"][1:3]
    assert first["replies"] == second["replies"] == 2
    assert abs(second["bytes_to_clients"] - first["bytes_to_clients"]) < 64, (first, second)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda args, d: args.update(test=d / "missing.npz"), "cannot read"),
        (lambda args, d: args.update(clients=[d / "one.npz"]), "x_train has samples of shape (63,)"),
        (lambda args, d: args.update(extra=["--min-clients", "3"]), "--min-clients 3: give 1 to 2"),
    ],
)
def test_bad_input_is_named_before_anything_starts(bundles, data, tmp_path, capsys, change, message):
    np.savez(tmp_path / "one.npz", x_train=np.zeros((100, 63), np.float32), y_train=np.zeros(100, np.int64))
    args = {"clients": data[0], "test": data[1], "extra": []}
    change(args, tmp_path)
    code = launch.main(
        [
            str(bundles[0]),
            "--data",
            *map(str, args["clients"]),
            "--test-data",
            str(args["test"]),
            "--out",
            str(tmp_path / "out"),
            *args["extra"],
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("pock-federate: error: ") and message in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_wire_round_trip_and_refusals(bundles):
    """to_wire keeps the trained rows only, from_wire writes them back over the rest, and a set of
    tensors that is not this bundle's is refused naming each difference."""
    bundle = load_bundle(bundles[0])
    state = {**bundle.initial_params, **bundle.initial_buffers}
    sent = wire.to_wire(bundle, state)
    np.testing.assert_array_equal(sent["2.weight"], state["2.weight"][:16])
    changed = {name: value + 1 for name, value in sent.items()}
    back = wire.from_wire(bundle, state, changed)
    assert sorted(back) == sorted(sent)
    np.testing.assert_array_equal(back["2.weight"][:16], state["2.weight"][:16] + 1)
    np.testing.assert_array_equal(back["2.weight"][16:], state["2.weight"][16:])
    wrong = {
        **{k: v for k, v in sent.items() if k != "4.bias"},
        "0.weight": state["0.weight"],
        "2.weight": state["2.weight"],
    }
    with pytest.raises(wire.WireError) as refused:
        wire.from_wire(bundle, state, wrong)
    assert str(refused.value) == (
        "missing 4.bias; unexpected 0.weight; wrong shape: 2.weight (64, 128) (expected (16, 128))"
    )
