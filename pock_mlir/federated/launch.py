"""pock-federate: a local federation on Flower's Deployment Engine, started and stopped by one command.

    pock-federate BUNDLE --data CLIENT0.npz CLIENT1.npz ... --test-data TEST.npz --out DIR
                  [--rounds R] [--local-epochs E] [--strategy fedavg|fedadam] [--min-clients K]

It starts a SuperLink (flower-superlink) and one SuperNode (flower-supernode) per --data file, all
on 127.0.0.1 ports that are free, then submits the app with `flwr run` and shows the server's
progress: each round's accuracy on TEST.npz (x_val, y_val) and the bytes sent each way. Each
client trains BUNDLE on its own file (pock-train's layout: x_train, y_train, optionally x_val,
y_val). Flower's full log goes to DIR/flower.log; results to DIR/federated.json, the global
model to DIR/global.safetensors (a PyTorch state_dict) and DIR/bundle. Every process it starts
is stopped when it ends, on success, on error and on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomli_w  # comes with Flower
except ImportError:
    sys.exit("pock-federate needs Flower: pip install 'pock-mlir[federated]'")

from pock_mlir.data import DataError, load_data
from pock_mlir.federated.server import RESULTS, SAY
from pock_mlir.runtime.bundle import BundleError, load_bundle

APP = Path(__file__).parent / "flower_app"
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode, flwr and flower-superexec live here
STARTUP_SECONDS = 60


class FederationError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        children.setdefault(parent, []).append(int(stat.parent.name))
    return children


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants. Flower's SuperExec and the apps it runs start sessions of their
    own, so a process group would miss them; they stay the children of the process that started them."""
    children, tree, todo = _children(), [pid], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            tree.append(child)
            todo.append(child)
    return tree


def stop_tree(process: subprocess.Popen, grace: float = 5.0) -> None:
    """Terminate `process` and every process under it; kill what is left after `grace` seconds."""
    tree = process_tree(process.pid) if process.poll() is None else [process.pid]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(pid) for pid in tree):
        process.poll()  # reap our own child so that it stops counting as alive
        time.sleep(0.1)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class LocalFederation:
    """A SuperLink and SuperNodes on 127.0.0.1, as a context manager that stops them all on exit.

    clients: (bundle, data) per SuperNode. work: a directory for Flower's home, the config files
    and the log. sent_logs: whether each client keeps a copy of every reply it sends
    (work/sent-N/round-R.safetensors)."""

    def __init__(self, clients: list[tuple[Path, Path]], work: Path, sent_logs: bool = False):
        self.clients, self.work, self.sent_logs = clients, Path(work), sent_logs
        self.port = free_port()
        # Flower reports usage events to its makers unless told not to: a local federation sends nothing.
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.work / "flower-home"),
            "FLWR_TELEMETRY_ENABLED": "0",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.log_path = self.work / "flower.log"
        self.superlink: subprocess.Popen | None = None
        self.supernodes: list[subprocess.Popen] = []

    def sent_log(self, index: int) -> Path:
        return self.work / f"sent-{index}"

    def __enter__(self) -> LocalFederation:
        home = self.work / "flower-home"
        home.mkdir(parents=True, exist_ok=True)
        (home / "config.toml").write_text(
            tomli_w.dumps(
                {"superlink": {"default": "local", "local": {"address": f"127.0.0.1:{self.port}", "insecure": True}}}
            )
        )
        self._log = open(self.log_path, "ab")
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _spawn(self, command: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            command,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # Ctrl-C reaches us alone

    def _start(self) -> None:
        # The SuperLink installs an app's dependencies with uv by default: offline, and needless here.
        self.superlink = self._spawn(
            [
                str(BIN / "flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ]
        )
        self._wait_for_port()
        for index, (bundle, data) in enumerate(self.clients):
            config = {"bundle": str(Path(bundle).resolve()), "data": str(Path(data).resolve()), "seed": index}
            if self.sent_logs:
                self.sent_log(index).mkdir(exist_ok=True)
                config["sent-log"] = str(self.sent_log(index).resolve())
            node_config = self.work / f"node-{index}.toml"
            node_config.write_text(tomli_w.dumps(config))
            self.supernodes.append(
                self._spawn(
                    [
                        str(BIN / "flower-supernode"),
                        "--insecure",
                        "--superlink",
                        f"127.0.0.1:{self.port}",
                        "--port",
                        str(free_port()),
                        "--node-config",
                        str(node_config),
                    ]
                )
            )

    def _wait_for_port(self) -> None:
        deadline = time.monotonic() + STARTUP_SECONDS
        while time.monotonic() < deadline:
            if self.superlink.poll() is not None:
                raise FederationError(
                    f"flower-superlink exited with code {self.superlink.returncode} (see {self.log_path})"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.2)
        raise FederationError(
            f"flower-superlink did not listen on 127.0.0.1:{self.port} within {STARTUP_SECONDS} s (see {self.log_path})"
        )

    def run(self, run_config: dict, show=print, timeout: float | None = None) -> int:
        """`flwr run` of the pock app with `run_config` (keys of flower_app/pyproject.toml), its
        stream of the server's log written to the log file; `show` gets the server's [pock] lines
        and errors. Returns flwr's exit code; raises FederationError past `timeout` seconds."""
        overrides = self.work / "run-config.toml"
        overrides.write_text(tomli_w.dumps(run_config))
        command = [str(BIN / "flwr"), "run", str(APP), "local", "--stream", "--run-config", str(overrides)]
        runner = subprocess.Popen(
            command,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            for line in runner.stdout:
                self._log.write(line)
                self._log.flush()
                text = line.decode(errors="replace").rstrip()
                if SAY in text:
                    show(text[text.index(SAY) + len(SAY) :].strip())
                elif "ERROR" in text or "Exception" in text:
                    show(text)
                if deadline is not None and time.monotonic() > deadline:
                    raise FederationError(f"the run did not finish within {timeout:.0f} s (see {self.log_path})")
            return runner.wait()
        finally:
            stop_tree(runner)

    def __exit__(self, *exc) -> None:
        for process in [*self.supernodes, self.superlink]:
            if process is not None:
                stop_tree(process)
        self._log.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pock-federate",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("bundle", help="the bundle every device trains (from pock-compile)")
    parser.add_argument("--data", nargs="+", required=True, help="one .npz per client, in pock-train's layout")
    parser.add_argument("--test-data", required=True, help="an .npz with x_val, y_val: the server evaluates on it")
    parser.add_argument("--out", required=True, help="directory for the results, the global model and Flower's log")
    parser.add_argument("--client-bundle", nargs="+", help="each client's bundle, if not BUNDLE (same order as --data)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--strategy", choices=("fedavg", "fedadam"), default="fedavg")
    parser.add_argument("--server-lr", type=float, default=0.01, help="FedAdam's server learning rate (default 0.01)")
    parser.add_argument("--min-clients", type=int, help="the fewest replies a round aggregates (default: every client)")
    parser.add_argument("--round-timeout", type=float, default=600, help="seconds a round waits for replies")
    return parser


def _check(args) -> list[tuple[Path, Path]]:
    """Every input, checked before any process starts: (bundle, data) per client."""
    bundles = args.client_bundle or [args.bundle] * len(args.data)
    if len(bundles) != len(args.data):
        raise DataError(
            f"--client-bundle names {len(bundles)} bundles for {len(args.data)} --data files; give one each"
        )
    if args.rounds < 1 or args.local_epochs < 1:
        raise DataError("--rounds and --local-epochs must be at least 1")
    minimum = len(args.data) if args.min_clients is None else args.min_clients
    if not 1 <= minimum <= len(args.data):
        raise DataError(f"--min-clients {minimum}: give 1 to {len(args.data)} (the number of clients)")
    server_bundle = load_bundle(args.bundle)
    _, held_out = load_data(args.test_data, server_bundle, need_train=False)
    if held_out is None:
        raise DataError(f"{args.test_data} holds no x_val, y_val for the server to evaluate on")
    for bundle, data in zip(bundles, args.data):
        load_data(data, load_bundle(bundle))
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {out} exists and is not a directory")
    return list(zip(map(Path, bundles), map(Path, args.data)))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        clients = _check(args)
    except (BundleError, DataError, OSError) as e:
        print(f"pock-federate: error: {e}", file=sys.stderr)
        return 1
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS).unlink(missing_ok=True)  # an earlier run's must not pass for this one's
    run_config = {
        "bundle": str(Path(args.bundle).resolve()),
        "test-data": str(Path(args.test_data).resolve()),
        "out": str(out),
        "num-server-rounds": args.rounds,
        "local-epochs": args.local_epochs,
        "strategy": args.strategy,
        "server-lr": args.server_lr,
        "clients": len(clients),
        "min-clients": args.min_clients or len(clients),
        "round-timeout": args.round_timeout,
    }
    # Ctrl-C and a kill stop the federation. Python leaves SIGINT ignored when its parent started it
    # so (a non-interactive shell does for `cmd &` jobs), which would leave a federation running.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.default_int_handler)
    try:
        with LocalFederation(clients, out) as federation:
            print(
                f"pock-federate: SuperLink on 127.0.0.1:{federation.port}, {len(clients)} SuperNodes; "
                f"Flower's log in {federation.log_path}",
                flush=True,
            )
            code = federation.run(run_config, show=lambda line: print(f"  {line}", flush=True))
    except KeyboardInterrupt:
        print("pock-federate: interrupted; every Flower process it started is stopped", file=sys.stderr)
        return 130
    except FederationError as e:
        print(f"pock-federate: error: {e}", file=sys.stderr)
        return 1
    if code != 0 or not finished(out):
        print(
            f"pock-federate: the run did not finish (flwr run exit code {code}; see {out / 'flower.log'})",
            file=sys.stderr,
        )
        return 1
    print(f"pock-federate: results in {out / RESULTS}")
    return 0


def finished(out: Path) -> bool:
    """Whether the ServerApp completed every round and wrote the global model (flwr run's exit
    code is 0 even when the ServerApp failed)."""
    try:
        return json.loads((out / RESULTS).read_text()).get("finished") is True
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    sys.exit(main())
