"""The compiler's stages and the pass pipeline that produces each, in one place: compile_training
runs them, the sparse-BP report reruns the autodiff and sparse ones, and tests and the bench vary them."""

# The pass pipeline after each stage, by stage name; `program.ir(stage)` shows the result.
# "{target}" stands for the target's name (its tuning table: pock_mlir/tuning/<name>.json).
STAGE_PIPELINES = {
    "autodiff": "inline,pock-autodiff,pock-dce",
    "sparse": "pock-sparse-bp",
    "lowered": "pock-expand-custom,pock-backend-switch{target={target}},pock-factor-reductions,pock-order-param-reads,pock-reorder-updates,pock-lower-optimizers,pock-reorder-updates{roots=returned},pock-strip-params,"
    "pock-dce,canonicalize,pock-step-into",
}
STAGES = ("imported", "training", *STAGE_PIPELINES)


def pipelines_without(pass_name: str) -> dict[str, str]:
    """compile_training's `pipelines` with one pass left out of the lowered stage (an ablation)."""
    return {"lowered": ",".join(p for p in STAGE_PIPELINES["lowered"].split(",") if p.split("{")[0] != pass_name)}


def pipelines_with_switch(options: str) -> dict[str, str]:
    """compile_training's `pipelines` with pock-backend-switch given more options, such as
    "force=im2col" or "exclude=per-image"."""
    switch = "pock-backend-switch{target={target}}"
    with_options = "pock-backend-switch{target={target} " + options + "}"
    return {"lowered": STAGE_PIPELINES["lowered"].replace(switch, with_options)}
