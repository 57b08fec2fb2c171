import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))  # tests import the oracle helpers as `oracle`

from bench.models import allow_torchvision  # noqa: E402

allow_torchvision()  # for the library models of test_zoo (transformers and timm import torchvision too)

# The compile cache (pock_mlir/cache.py) lives for one test session, shared by the tools the tests
# run: a session compiles nothing twice, and nothing from an earlier run decides its results.
os.environ["POCK_MLIR_CACHE_DIR"] = tempfile.mkdtemp(prefix="pock-test-cache-")
atexit.register(shutil.rmtree, os.environ["POCK_MLIR_CACHE_DIR"], ignore_errors=True)
