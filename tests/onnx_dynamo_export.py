"""Child process of tests/test_onnx.py: torch.onnx.export(dynamo=True) of saved torch.export
programs. The dynamo exporter needs onnxscript, which needs onnx >= 1.17, while the venv pins onnx
1.16.2 (onnxruntime-training 1.19.2's): the parent puts the directory of onnxscript and its newer
onnx (tests/onnxscript-requirements.txt) first on this process's path alone.

    python tests/onnx_dynamo_export.py PROGRAM.pt2 OUT.onnx [PROGRAM.pt2 OUT.onnx ...]
"""

import sys
import warnings

import torch

OPSET = 18  # the dynamo exporter's own; onnx 1.16.2 and onnxruntime 1.19.2 read it

for program, out in zip(sys.argv[1::2], sys.argv[2::2]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # optimize=False: onnxscript's optimizer folds weights into new initializers (a Linear's
        # weight transposed, an embedding's rows gathered), which would train another model.
        onnx_program = torch.onnx.export(
            torch.export.load(program), dynamo=True, opset_version=OPSET, optimize=False, verbose=False
        )
    onnx_program.save(out)
