"""docs/supported-ops.md's table is exactly the one the rule table generates."""

from pathlib import Path

from pock_mlir.op_facts import derivative_rules
from pock_mlir.tools.ops_table import BEGIN, END, main, ops_table, with_table

PAGE = Path(__file__).resolve().parent.parent / "docs" / "supported-ops.md"


def test_page_holds_the_generated_table():
    text = PAGE.read_text()
    assert with_table(text, ops_table()) == text, (
        "docs/supported-ops.md is stale: run `python -m pock_mlir.tools.ops_table --update docs/supported-ops.md`"
    )


def test_table_has_one_row_per_rule_with_its_family():
    rows = ops_table().splitlines()[2:]
    assert len(rows) == len(derivative_rules())
    assert "| `aten.embedding` | transformer | index_put(zeros, [ids], g, accumulate=True)" in ops_table()


def test_update_rewrites_only_the_marked_block(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"intro\n{BEGIN}\nold table\n{END}\noutro\n")
    assert main(["--update", str(page)]) == 0
    assert page.read_text() == f"intro\n{BEGIN}\n{ops_table()}{END}\noutro\n"
