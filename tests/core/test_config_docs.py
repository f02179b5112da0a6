"""Every config field is documented in its dataclass, docs/guide/configuration.md is generated from those docs and
is current, and every shipped config opens with a header saying what it trains, its weights and its launch."""

from dataclasses import dataclass

import pytest
from conftest import REPO

from flowrl.config_docs import PAGE, field_docs, main, page, undocumented

SHIPPED = sorted((REPO / "configs").glob("*.yaml")) + sorted((REPO / "configs" / "real").glob("*.yaml"))


@dataclass
class Documented:
    first: int = 1
    """The first field's doc,
    over two lines."""
    second: str = "x"  # a comment is not a doc
    third: bool = False
    """The third's."""


def test_field_docs_are_the_strings_under_the_fields():
    assert field_docs(Documented) == {"first": "The first field's doc, over two lines.", "third": "The third's."}


def test_every_config_field_and_algorithm_parameter_is_documented():
    assert undocumented() == []


def test_the_configuration_page_is_current(tmp_path):
    """When this fails, run `python -m flowrl.config_docs` and commit the page."""
    assert PAGE.read_text(encoding="utf-8") == page()
    assert main(["--check"]) == 0
    assert main(["--check", "--out", str(tmp_path / "stale.md")]) == 1


@pytest.mark.parametrize("path", SHIPPED, ids=[p.relative_to(REPO).as_posix() for p in SHIPPED])
def test_every_shipped_config_opens_with_what_it_trains_its_weights_and_its_launch(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[: next(i for i, line in enumerate(lines) if not line.startswith("#"))]
    text = "\n".join(header)
    assert len(header) >= 3 and header[0].startswith("# ") and "Weights:" in text and "Launch:" in text, path
    assert f"flowrl train {path.relative_to(REPO).as_posix()}" in text
    if path.parent.name == "real":
        assert "hf download" in text
    assert "issue" not in text.lower()
