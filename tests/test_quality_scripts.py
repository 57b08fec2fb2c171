"""The quality scripts (examples/quality) in their quick modes: every stage runs on a few of the
schemes. A file of its own so that `make test`'s two workers share the long example runs."""

import json
import sys

import numpy as np
import pytest
from test_examples import REPO, run


@pytest.mark.parametrize("task, schemes", [("vision", 3), ("language", 3), ("text", 3)])
def test_quality_script_quick(task, schemes, tmp_path):
    done = run([sys.executable, REPO / "examples" / "quality" / f"{task}.py", "--quick", "--out", tmp_path], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / f"{task}.json").read_text())["results"]
    assert len(results) == schemes and (tmp_path / f"{task}.png").stat().st_size > 0
    # the metric against device memory, for the runs that have it (pock-mlir's)
    assert (tmp_path / f"{task}_memory.png").stat().st_size > 0
    assert all((r.get("device_mb") or 0) > 0 for name, r in results.items() if not name.startswith("pytorch"))
    table = (tmp_path / f"{task}.md").read_text()
    assert all(f"| {name} |" in table for name in results)


def test_quick_quality_run_never_overwrites_the_quoted_results(tmp_path):
    results = REPO / "examples" / "quality" / "results"
    done = run([sys.executable, REPO / "examples" / "quality" / "vision.py", "--quick", "--out", results], tmp_path)
    assert done.returncode == 2 and "would overwrite the results docs/quality.md quotes" in done.stderr


def test_search_budgets_and_the_searched_rows_order():
    """--search presets|MB,...; each searched row follows the scheme whose memory it was searched at."""
    import argparse
    from pathlib import Path

    from examples.quality.cli import (
        PRESETS,
        add_search_option,
        in_table_order,
        search_budgets,
        searched_against,
        searched_schemes,
        searches,
    )

    parser = argparse.ArgumentParser()
    add_search_option(parser)
    assert search_budgets(parser, parser.parse_args(["--search", "presets"])) == PRESETS
    assert search_budgets(parser, parser.parse_args(["--search", "4,8.5"])) == [4.0, 8.5]
    assert search_budgets(parser, parser.parse_args([])) == []
    for bad in ("4,x", "0", "-3"):
        with pytest.raises(SystemExit):
            search_budgets(parser, parser.parse_args(["--search", bad]))
    searched = searched_schemes(Path("out"), "vision", {10.5: "preset", 4.0: None})
    assert [(s.name, s.file, s.against) for s in searched] == [
        ("searched (10.50 MB, preset's memory)", "out/vision_search_10.50MB.yaml", "preset"),
        ("searched (4.00 MB)", "out/vision_search_4.00MB.yaml", None),
    ]
    results = {"full": 1, "preset": 2, "other": 3, searched[1].name: 4, searched[0].name: 5}
    assert list(in_table_order(results, searched)) == ["full", "preset", searched[0].name, "other", searched[1].name]
    # a scheme over the int8 base is searched over it, in a search of its own
    searched = searched_schemes(
        Path("out"), "language", {9.25: "preset, int8 base", 10.5: "preset"}, {"preset, int8 base": "int8"}
    )
    assert [(s.name, s.file, s.quantize) for s in searched] == [
        ("searched over int8 (9.25 MB, preset, int8 base's memory)", "out/language_search_9.25MB_int8.yaml", "int8"),
        ("searched (10.50 MB, preset's memory)", "out/language_search_10.50MB.yaml", None),
    ]
    assert searches(searched) == {"int8": searched[:1], None: searched[1:]}
    assert [searched_against(s.name) for s in searched] == ["preset, int8 base", "preset"]
    assert searched_against("searched (4.00 MB)") is None and searched_against("preset") is None


def test_text_task_deals_each_topic_out_in_pieces_and_labels_windows_by_their_text():
    """examples/quality/text.py: training, validation and test text share no character of a topic
    and take 14, 3 and 3 of every 20 pieces; a window's label is the text it was cut from."""
    from examples.quality import text

    tokens = np.arange(45 * text.CHUNK + 100)  # 46 pieces, the last one short
    train, val, test = text.deal(tokens)
    assert sorted(np.concatenate([train, val, test]).tolist()) == tokens.tolist()
    pieces = [{int(i) // text.CHUNK for i in share} for share in (train, val, test)]
    assert pieces == [
        {i for i in range(46) if i % 20 < 14},
        {i for i in range(46) if 14 <= i % 20 < 17},
        {i for i in range(46) if i % 20 >= 17},
    ]
    texts = [np.full(1000, label) for label in range(4)]
    x, y = text.labelled_windows(texts, 10, np.random.RandomState(0))
    assert x.shape == (10, text.SEQ) and (x == y[:, None]).all() and np.bincount(y).tolist() == [3, 3, 2, 2]


def test_seeds_table_pairs_each_searched_row_with_its_scheme(tmp_path):
    """examples/quality/seeds.py: rows line up across seeds although the budgets differ; the mean
    difference and its standard error are numpy's."""
    from examples.quality import seeds

    accuracy = {0: (0.95, 0.97), 1: (0.96, 0.94), 2: (0.90, 0.93)}  # seed: (preset, searched)
    for seed, (preset, searched) in accuracy.items():
        where = tmp_path if seed == 0 else tmp_path / f"seed{seed}"
        where.mkdir(exist_ok=True)
        rows = {
            "full": {"accuracy": 0.98},
            "preset": {"accuracy": preset},
            f"searched ({5 + seed:.2f} MB, preset's memory)": {"accuracy": searched},
        }
        (where / "vision.json").write_text(json.dumps({"seed": seed, "results": rows}))
    assert seeds.main(["--results", str(tmp_path)]) == 0
    table = (tmp_path / "vision_seeds.md").read_text()
    differences = 100 * np.array([s - p for p, s in accuracy.values()])
    error = differences.std(ddof=1) / np.sqrt(len(differences))
    assert (
        f"| searched at preset's memory | 0.970 | 0.940 | 0.930 | 0.947 | {differences.mean():+.1f} ± {error:.1f} |"
        in table
    )
    assert "| full | 0.980 | 0.980 | 0.980 | 0.980 |  |" in table
    # a seed run with other rows is refused, naming the fix
    (tmp_path / "seed1" / "vision.json").write_text(json.dumps({"seed": 1, "results": {"full": {"accuracy": 0.9}}}))
    with pytest.raises(SystemExit, match="same options"):
        seeds.main(["--results", str(tmp_path)])


def test_the_quoted_seeds_table_is_the_committed_runs():
    from examples.quality import seeds
    from examples.quality.cli import RESULTS

    assert (RESULTS / "vision_seeds.md").read_text() == seeds.table(seeds.runs(RESULTS)) + "\n"
