"""JAX as a bench peer for the LLaMA-like decoder (examples/models/transformer.py's LlamaLike),
in a process that never imports torch. `python -m bench.jax_child '<json spec>'` takes what
bench/child.py's "jax-export" task wrote in spec["artifacts"] (the model's config, its parameters and buffers by their
PyTorch names, which parameters the scheme trains, the batch) and speaks the protocol of
bench/child.py. The port is the model written in jax.numpy as its PyTorch forward reads; a step
is one `jax.jit` function (loss, gradients of the trained parameters, the optimizer as
torch.optim.AdamW computes it) whose trained parameters and optimizer state are donated, so XLA
updates them in place. Peak memory is over the resident set after importing numpy and jax.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from bench.protocol import block_torch, print_result, timed_rounds, torch_loaded

block_torch()  # before anything else is imported: this process must run without it

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from bench.memory import rss_kb  # noqa: E402


def rms_norm(x, weight, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return jnp.concatenate((-x[..., half:], x[..., :half]), axis=-1)


def attention(p, prefix, x, cos, sin, config):
    b, t, _ = x.shape
    head_dim = config["dim"] // config["heads"]
    # (B, T, heads, head_dim): the layout jax.nn.dot_product_attention takes; its grouped-query
    # attention gives query head h the key/value head h // (heads / kv_heads), as repeat_kv does
    q = (x @ p[f"{prefix}.q.weight"].T).reshape(b, t, config["heads"], head_dim)
    k = (x @ p[f"{prefix}.k.weight"].T).reshape(b, t, config["kv_heads"], head_dim)
    v = (x @ p[f"{prefix}.v.weight"].T).reshape(b, t, config["kv_heads"], head_dim)
    cos, sin = cos[:, None, :], sin[:, None, :]
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    attended = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    return attended.reshape(b, t, -1) @ p[f"{prefix}.o.weight"].T


def llama_forward(p, ids, config):
    """LlamaLike.forward: token ids (B, T) -> logits (B, T, vocab), the output projection tied to
    the token embedding (one array, "tokens.weight", as torch's named_parameters lists it)."""
    t, eps = ids.shape[1], config["eps"]
    cos, sin = p["cos"][:t], p["sin"][:t]
    x = p["tokens.weight"][ids]
    for i in range(config["layers"]):
        block = f"blocks.{i}"
        x = x + attention(
            p, f"{block}.attention", rms_norm(x, p[f"{block}.attention_norm.weight"], eps), cos, sin, config
        )
        h = rms_norm(x, p[f"{block}.ffn_norm.weight"], eps)
        gate, up = h @ p[f"{block}.gate.weight"].T, h @ p[f"{block}.up.weight"].T
        x = x + (jax.nn.silu(gate) * up) @ p[f"{block}.down.weight"].T
    return rms_norm(x, p["norm.weight"], eps) @ p["tokens.weight"].T


def token_cross_entropy(logits, target):
    log_probs = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, target.reshape(-1, 1), axis=1))


def adamw(optimizer):
    """torch.optim.AdamW's update (decoupled weight decay, bias-corrected moments)."""
    lr, (beta1, beta2), eps, decay = optimizer["lr"], optimizer["betas"], optimizer["eps"], optimizer["weight_decay"]

    def init(params):
        def zeros():  # a buffer of its own for each moment: donated buffers must be distinct
            return {name: jnp.zeros_like(value) for name, value in params.items()}

        return {"step": jnp.zeros((), jnp.float32), "exp_avg": zeros(), "exp_avg_sq": zeros()}

    def update(params, grads, state):
        t = state["step"] + 1
        m = {n: beta1 * state["exp_avg"][n] + (1 - beta1) * g for n, g in grads.items()}
        v = {n: beta2 * state["exp_avg_sq"][n] + (1 - beta2) * g * g for n, g in grads.items()}
        step_size = lr / (1 - beta1**t)
        root_correction = jnp.sqrt(1 - beta2**t)
        new = {
            n: p * (1 - lr * decay) - step_size * m[n] / (jnp.sqrt(v[n]) / root_correction + eps)
            for n, p in params.items()
        }
        return new, {"step": t, "exp_avg": m, "exp_avg_sq": v}

    return init, update


def train_step(config, optimizer):
    """The jitted step: (trained, state, frozen, ids, target) -> (trained, state, loss), its first
    two arguments donated."""
    init, update = adamw(optimizer)

    def step(trained, state, frozen, ids, target):
        def loss_of(trained):
            return token_cross_entropy(llama_forward({**frozen, **trained}, ids, config), target)

        loss, grads = jax.value_and_grad(loss_of)(trained)
        trained, state = update(trained, grads, state)
        return trained, state, loss

    return init, jax.jit(step, donate_argnums=(0, 1))


def load(directory: Path):
    """The exported model: config, parameters split into trained and frozen, the batch."""
    exported = json.loads((directory / "model.json").read_text())
    with np.load(directory / "arrays.npz") as saved:
        arrays = {name: jnp.asarray(saved[name]) for name in saved.files}
    with np.load(directory / "batch.npz") as saved:
        ids, target = jnp.asarray(saved["ids"]), jnp.asarray(saved["target"])
    trained = {n: a for n, a in arrays.items() if n in exported["trained"]}
    frozen = {n: a for n, a in arrays.items() if n not in exported["trained"]}
    return exported, trained, frozen, ids, target


def run_jax(spec) -> dict:
    exported, trained, frozen, ids, target = load(Path(spec["artifacts"]))
    init, step = train_step(exported["config"], exported["optimizer"])
    state = init(trained)

    def one_step():
        nonlocal trained, state
        trained, state, loss = step(trained, state, frozen, ids, target)
        return float(loss)  # waits for the step

    start = time.perf_counter()
    one_step()  # compiles; it is also the first warm-up step, as torch.compile's row does
    compile_s = time.perf_counter() - start
    result = timed_rounds(one_step, {**spec, "warmup": max(spec["warmup"] - 1, 0)})
    return {
        **result,
        "compile_s": compile_s,
        "trainable_params": sum(math.prod(a.shape) for a in trained.values()),
        "torch_loaded": torch_loaded(),
        "jax": jax.__version__,
        "jax_device": str(jax.devices()[0]),
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    print_result(lambda: run_jax(spec), rss_kb())


if __name__ == "__main__":
    main()
