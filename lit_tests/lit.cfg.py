# lit configuration: pock-opt, iree-opt and filecheck (PyPI's FileCheck) from the project's venv.
import os
import shutil

import lit.formats

config.name = "pock-mlir"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
config.excludes = ["lit.cfg.py", "Output", "inputs"]

bin_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv", "bin")
path = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
config.environment["PATH"] = path
for tool in ("pock-opt", "iree-opt", "filecheck"):
    found = shutil.which(tool, path=path)
    if found is None:
        lit_config.fatal(f"{tool} not found; run `make test` (it installs the venv)")
    config.substitutions.append((f"\\b{tool}\\b" if tool != "filecheck" else "\\bFileCheck\\b", found))
    if tool == "filecheck":
        config.substitutions.append(("\\bfilecheck\\b", found))
