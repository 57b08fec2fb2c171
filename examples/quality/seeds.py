"""The vision task over several seeds: is a searched scheme as accurate as the hand-written one
whose memory it was searched at?

One run's test split has 256 images, so a row's accuracy moves in steps of 0.4 points and a
difference of one to three images between two rows is within one run's noise. Each seed is a
whole replicate: its own data split and order, pretraining, fine-tuning and search. This reads
the runs of `vision.py --search presets` (seed 0 in examples/quality/results/, seed N in
examples/quality/results/seed<N>/) and writes examples/quality/results/vision_seeds.md: every
scheme's test accuracy per seed and its mean, and for each searched row the mean over seeds of its
difference to its hand-written scheme, with the standard error of that mean.

    python examples/quality/vision.py --search presets --seed 1 --out examples/quality/results/seed1
    python examples/quality/seeds.py
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from examples.quality.cli import RESULTS, searched_against  # noqa: E402
from pock_mlir.files import atomic_write  # noqa: E402


def runs(results: Path) -> dict[int, dict]:
    """{seed: vision.json's results} for seed 0 (results/) and each results/seed<N>/."""
    found = {}
    for path in [results / "vision.json", *sorted(results.glob("seed*/vision.json"))]:
        data = json.loads(path.read_text())
        seed = data["seed"]
        if path.parent != results and path.parent.name != f"seed{seed}":
            raise SystemExit(f"{path} holds seed {seed}'s run, not {path.parent.name}'s: move it to seed{seed}/")
        found[seed] = data["results"]
    return found


def by_scheme(results: dict) -> dict[str, tuple[dict, str | None]]:
    """A run's rows, each with the hand-written scheme it was searched at (None for the others),
    keyed so that seeds line up: a searched row's budget differs between seeds (it is the
    preset's measured memory), so it is keyed by that scheme."""
    keyed = {}
    for name, row in results.items():
        against = searched_against(name)
        keyed[f"searched at {against}'s memory" if against else name] = row, against
    return keyed


def table(seeds: dict[int, dict]) -> str:
    keyed = {seed: by_scheme(results) for seed, results in sorted(seeds.items())}
    order = list(keyed)
    names = list(keyed[order[0]])
    for seed, rows_of_seed in keyed.items():
        if list(rows_of_seed) != names:
            raise SystemExit(
                f"seed {seed}'s run has the rows {list(rows_of_seed)}, seed {order[0]}'s {names}: run "
                f"every seed with the same options (--search presets)"
            )
    rows = [
        f"| scheme | {' | '.join(f'seed {s}' for s in order)} | mean test accuracy | searched - hand-written "
        f"(points, mean ± s.e. over seeds) |",
        "| --- |" + " ---: |" * (len(order) + 2),
    ]
    for name in names:
        accuracy = [keyed[s][name][0]["accuracy"] for s in order]
        difference = ""
        against = keyed[order[0]][name][1]
        if against:
            points = [100 * (keyed[s][name][0]["accuracy"] - keyed[s][against][0]["accuracy"]) for s in order]
            error = f" ± {statistics.stdev(points) / math.sqrt(len(points)):.1f}" if len(points) > 1 else ""
            difference = f"{statistics.mean(points):+.1f}{error}"
        rows.append(
            f"| {name} | {' | '.join(f'{a:.3f}' for a in accuracy)} | {statistics.mean(accuracy):.3f} | {difference} |"
        )
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(RESULTS), help="where vision.json and seed<N>/vision.json are")
    args = parser.parse_args(argv)
    results = Path(args.results)
    if not (results / "vision.json").is_file():
        parser.error(
            f"{results / 'vision.json'} does not exist: run python examples/quality/vision.py --search presets"
        )
    seeds = runs(results)
    text = table(seeds)
    print(text)
    atomic_write(results / "vision_seeds.md", text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
