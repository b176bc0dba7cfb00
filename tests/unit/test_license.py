"""The repository carries the licence that pyproject.toml declares, in full."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_license_file_is_the_apache_2_text_that_pyproject_declares():
    declared = re.search(r'^license = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared and declared.group(1) == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License\n                           Version 2.0, January 2004" in text
    for part in (
        "1. Definitions.",
        "9. Accepting Warranty or Additional Liability.",
        "END OF TERMS AND CONDITIONS",
        "APPENDIX: How to apply the Apache License",
    ):
        assert part in text, part
    assert len(text.splitlines()) == 202  # the whole text, not a notice
