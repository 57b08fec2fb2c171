"""README.md quotes the result tables the scripts write (bench/, examples/quality/) verbatim."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("readme_results", ROOT / "tools" / "readme_results.py")
readme_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_results)


def test_readme_quotes_every_results_file_and_none_is_stale():
    text = (ROOT / "README.md").read_text()
    quoted = [m.group("path") for m in readme_results.BLOCK.finditer(text)]
    assert quoted == ["examples/quality/results/vision.md", "examples/quality/results/language.md",
                      "examples/quality/results/text.md", "examples/quality/results/vision_seeds.md",
                      "examples/quality/results/federated.md", "bench/results.md"]
    assert readme_results.stale_blocks(text) == [], "run `python tools/readme_results.py`"


def test_refresh_replaces_only_the_block_and_demotes_headings(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results: bench/results.md -->\nold numbers\n<!-- results:end -->\noutro\n")
    assert readme_results.main(["--check", "--readme", str(readme)]) == 1
    assert readme_results.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    body = (ROOT / "bench" / "results.md").read_text()
    assert text.startswith("intro\n<!-- results: bench/results.md -->\n### ") and text.endswith("<!-- results:end -->\noutro\n")
    assert "old numbers" not in text and body.splitlines()[2] in text
    assert readme_results.main(["--check", "--readme", str(readme)]) == 0
