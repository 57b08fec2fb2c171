import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))  # tests import the oracle helpers as `oracle`

# Two xdist workers share the machine's cores. PyTorch's OpenMP threads in one wait at every op's
# barrier for a core the other holds (a quality script's PyTorch reference stepped tens of times
# slower), so PyTorch runs one thread in the tests and the scripts they start; their results do
# not depend on it. Set before anything loads torch (OpenMP reads it once).
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The compile cache (pock_mlir/cache.py) lives for one test session, shared by xdist's workers
# (they inherit the controller's environment, which made it and removes it) and the tools the tests
# run: a session compiles nothing twice, and nothing from an earlier run decides its results.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["POCK_MLIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="pock-test-cache-")
    atexit.register(shutil.rmtree, os.environ["POCK_MLIR_CACHE_DIR"], ignore_errors=True)

# The longest files first: `make test` runs a file per worker (pytest-xdist --dist loadfile), and a
# long file started last leaves the other worker idle while it runs.
LONGEST_FIRST = (
    "test_zoo.py",
    "test_readme_commands.py",
    "test_examples.py",
    "test_quality_scripts.py",
    "test_keyword_inputs.py",
    "test_federated.py",
    "test_targets.py",
    "test_tune.py",
    "test_onnx.py",
    "test_frameworks_via_onnx.py",
    "test_checkpoint_weights.py",
    "test_export_pretrained.py",
    "test_lora.py",
    "test_moe.py",
    "test_state_dict.py",
    "test_doc_examples.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept otherwise
