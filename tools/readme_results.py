"""Write the generated blocks of README.md and docs/*.md, so that no number or pass list in them is typed by hand.

    python tools/readme_results.py           # rewrite every page's generated blocks
    python tools/readme_results.py --check   # exit 1 (naming the stale blocks) when one differs

A block is the text between `<!-- results: SOURCE -->` and `<!-- results:end -->`. SOURCE is either a
Markdown file the scripts write (relative to the repository; its headings demoted two levels, so that
they sit under the section that quotes them): bench/ writes bench/results.md, bench/held_out.py
bench/runs/<machine>/.../held_out_summary.md, examples/quality/ writes
examples/quality/results/{vision,vision_seeds,language,text,federated}.md; or a generated view:
`pipeline` (the compiler's stages, from pock_mlir/stages.py), `targets` (the compilation targets, from
pock_mlir/targets.py) or `bench-summary` (a few columns of bench/results.json). Run it after
`make bench`, a held-out run, a quality run or a change of the stage pipelines or targets.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from pathlib import Path

from pock_mlir.files import atomic_write
from pock_mlir.stages import STAGE_PIPELINES
from pock_mlir.targets import TARGETS, host_arch, resolve_target, vector_tails

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- results: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- results:end -->)", re.S)
PEERS = {"eager": "PyTorch eager", "torch.compile": "torch.compile", "ort-training": "ONNX Runtime", "jax": "JAX"}


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def pipeline_figure() -> str:
    """The data path, with the pass pipeline of each stage that has one (`program.ir(stage)` after each)."""
    width = max(map(len, STAGE_PIPELINES)) + 1
    lines = [
        "```text",
        "nn.Module + loss ─torch.export + torch-mlir FX importer─▶ torch dialect      [stage: imported]",
        "  ─▶ pock dialect: pock.param, pock.grad, optimizer ops                     [stage: training]",
    ]
    for stage, pipeline in STAGE_PIPELINES.items():
        passes = [p.split("{")[0] for p in pipeline.split(",")]
        chain = textwrap.wrap(" ▸ ".join(passes), 96 - width - 6, break_on_hyphens=False)
        lines.append(f"  ─▶ {stage + ':':<{width}} {chain[0]}")
        lines += [" " * (width + 6) + more for more in chain[1:]]
    lines += ["  ─▶ IREE ─▶ .vmfb + parameters ─▶ torch-free Trainer (pock_mlir.runtime), or iree-run-module", "```"]
    return "\n".join(lines) + "\n"


def bench_summary() -> str:
    """pock-mlir's full and sparse step against the fastest peer's full step, and the deployed
    trainer's peak memory against ONNX Runtime's on the same optimizer, per model."""
    results = json.loads((ROOT / "bench" / "results.json").read_text())
    rows = {(r["model"], r["scheme"], r["system"]): r for r in results["rows"] if r["status"] == "ok"}
    lines = [
        f"{results['date'][:10]}, {results['machine']['cpu']} ({results['machine']['cpu_id']}), "
        f"{results['machine']['cores']} cores. Step time: the median; peak memory: the training process's, "
        "the deployed bundle's without PyTorch and, where ONNX Runtime has no momentum SGD, with its plain SGD.",
        "",
        "| model | pock-mlir full step ms | fastest peer's full step ms | pock-mlir sparse step ms "
        "| deployed pock-mlir peak MB | ONNX Runtime peak MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for model, title in results["settings"]["models"].items():

        def cell(scheme, systems, key, digits, model=model):
            """`key` of the first of `systems` that has a row for this model and scheme."""
            row = next((rows[model, scheme, s] for s in systems if (model, scheme, s) in rows), None)
            return f"{row[key]:.{digits}f}" if row else ""

        peers = [(rows[model, "full", p]["step_ms"], name) for p, name in PEERS.items() if (model, "full", p) in rows]
        fastest = "{:.2f} ({})".format(*min(peers)) if peers else ""
        cells = [
            title,
            cell("full", ["pock-mlir"], "step_ms", 2),
            fastest,
            cell("sparse", ["pock-mlir"], "step_ms", 2),
            cell("full", ["pock-mlir-deployed-ort-optimizer", "pock-mlir-deployed"], "peak_mb", 1),
            cell("full", ["ort-training"], "peak_mb", 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def targets_table() -> str:
    """Each target of pock_mlir.targets.TARGETS: what may follow its name, what its default compiles
    for, with which IREE flags, and the runtime drivers that run it. `host`'s vector-tail flag is
    its machine's (targets.vector_tails), so shown as x86-64 has it, wherever this runs."""
    lines = ["| target | default | IREE flags (of the default) | runs with |", "| --- | --- | --- | --- |"]
    for kind in TARGETS.values():
        target = resolve_target(kind.name)
        flags = [f"`{f}`" for f in target.compile_flags() if kind.name != "host" or f not in vector_tails(host_arch())]
        if kind.name == "host":
            flags += [f"`{f}` (on x86-64)" for f in vector_tails("x86_64")]
        cells = [f"`{kind.usage()}`", target.description, " ".join(flags), ", ".join(f"`{d}`" for d in kind.drivers)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


GENERATED = {"pipeline": pipeline_figure, "targets": targets_table, "bench-summary": bench_summary}


def quoted(source: str) -> str:
    if source in GENERATED:
        return GENERATED[source]()
    path = ROOT / source
    if not path.is_file():
        raise SystemExit(f"a page quotes {source}, which does not exist: run the script that writes it")
    text = re.sub(r"^(#+) ", lambda m: "#" * min(len(m.group(1)) + 2, 6) + " ", path.read_text(), flags=re.M)
    return text.rstrip("\n") + "\n"


def refreshed(page: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + quoted(m.group("path")) + m.group(4), page)


def stale_blocks(page: str) -> list[str]:
    return [m.group("path") for m in BLOCK.finditer(page) if m.group("body") != quoted(m.group("path"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale blocks")
    parser.add_argument("--page", action="append", help="a page to refresh (default: README.md and docs/*.md)")
    args = parser.parse_args(argv)
    stale_pages = 0
    for page in map(Path, args.page or pages()):
        text = page.read_text()
        if args.check:
            stale = stale_blocks(text)
            for source in stale:
                print(
                    f"{page}: the block quoting {source} is stale: run python tools/readme_results.py", file=sys.stderr
                )
            stale_pages += bool(stale)
        elif refreshed(text) != text:
            atomic_write(page, refreshed(text))
    return 1 if stale_pages else 0


if __name__ == "__main__":
    sys.exit(main())
