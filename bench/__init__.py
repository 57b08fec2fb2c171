"""pock-mlir's benchmark suite: `python -m bench` (see bench/__main__.py)."""
