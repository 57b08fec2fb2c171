"""bench/llm_scale.py's pieces that decide what a row measures, on a tiny LLaMA (no compile, no
timing): the schemes train what the docs say, checked against the model's own parameter names and
PEFT, and the FLOPs counted on the meta device equal those counted on real tensors plus the
attention's matmuls."""

import torch
import transformers

from bench import llm_scale
from bench.models import trainable_names


def _tiny(device):
    with torch.device(device):
        return transformers.AutoModelForCausalLM.from_config(llm_scale._config("tiny", 16), dtype=torch.float32)


def test_the_sparse_scheme_trains_the_last_two_blocks_norms_and_first_ffn_linear():
    model = _tiny("meta")
    trained = trainable_names(llm_scale.scheme_dict(llm_scale.ARCHS["tiny"], "sparse", "fp32"), model)
    expected = {"model.norm.weight"}
    for layer in (2, 3):
        prefix = f"model.layers.{layer}."
        expected |= {prefix + f"self_attn.{p}_proj.weight" for p in "qkvo"}
        expected |= {prefix + "mlp.gate_proj.weight", prefix + "input_layernorm.weight"}
        expected |= {prefix + "post_attention_layernorm.weight"}
    assert trained == expected


def test_a_quantized_base_adds_only_the_quantize_key():
    arch = llm_scale.ARCHS["tiny"]
    for scheme in ("sparse", "lora"):
        plain = llm_scale.scheme_dict(arch, scheme, "fp32")
        assert llm_scale.scheme_dict(arch, scheme, "int4") == {**plain, "quantize": {"frozen": "int4"}}
    assert llm_scale.scheme_dict(arch, "full", "fp32") == "full"


def test_meta_flops_are_the_real_steps_plus_the_attention_matmuls(tmp_path):
    from bench.flops import step_flops

    torch.manual_seed(0)
    _tiny("cpu").save_pretrained(tmp_path)
    spec = {"arch": "tiny", "scheme": "full", "base": "fp32", "dir": str(tmp_path), "seq_len": 16}
    counted = llm_scale.child_flops(spec)
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager")
    inputs, target = llm_scale._batch(model.config.vocab_size, 16)
    real = step_flops(lambda: llm_scale._loss(model(**inputs), target).backward())
    assert counted["flops"] == real
    assert counted["parameters"] == counted["trainable"] == sum(p.numel() for p in model.parameters())


def test_a_missed_memory_target_says_where_each_phase_peaked():
    row = {
        **{"arch": "1b", "scheme": "sparse", "base": "int4", "system": "pock-mlir", "status": "ok"},
        **{"peak_mib": 4096, "peak_compile_mib": 512, "peak_load_mib": 2560, "peak_steps_mib": 4096},
        **{"device_mib": 3072, "workspace_mib": 1024, "peak_cold_mib": 4608, "peak_percent": 40.0},
    }
    line = next(x for x in llm_scale.targets([row]) if "sparse over int4, peak under 3" in x)
    assert line.endswith(
        "**missed by 1.00 GiB** (4.00 GiB); compiling from the cache peaked at 0.50 GiB, loading the Trainer at "
        "2.50, the steps at 4.00 (the device's 3.00, of which 1.00 workspace), the cold process at 4.50"
    )
    earlier = {k: v for k, v in row.items() if k not in ("peak_load_mib", "peak_steps_mib", "device_mib")}
    line = next(x for x in llm_scale.targets([earlier]) if "sparse over int4, peak under 3" in x)
    assert line.endswith("compiling from the cache peaked at 0.50 GiB, the cold process at 4.50")


def test_the_compile_target_is_the_slowest_7b_rows():
    rows = [
        {"arch": "7b", "scheme": scheme, "base": "int4", "system": "pock-mlir", "status": "ok", "compile_s": seconds}
        | {"peak_mib": 8192, "peak_compile_mib": 512, "peak_cold_mib": 8192}
        for scheme, seconds in (("sparse", 120.0), ("lora", 330.0))
    ]
    line = next(x for x in llm_scale.targets(rows) if "compile under 5 minutes" in x)
    assert line.endswith("**missed by 0.50 min** (5.50 min) (the slowest row, lora over int4)")
