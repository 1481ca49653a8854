# SPDX-License-Identifier: Apache-2.0
"""The docs quote the example as it is (the repository's snippet check), and the example runs."""
import subprocess
import sys
from pathlib import Path

PYTHON = Path(__file__).resolve().parent.parent
ROOT = PYTHON.parent


def test_docs_quote_the_example():
    # tests/readme/check_snippets.py: a block after `<!-- snippet: FILE#NAME -->` equals the region.
    # (ctest checks docs/pytorch.md with the other docs; python/README.md is checked here.)
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "readme" / "check_snippets.py"), str(ROOT),
                          str(PYTHON / "README.md"), str(ROOT / "docs" / "pytorch.md")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 snippet(s) match" in out.stdout


def test_the_example_trains():
    out = subprocess.run([sys.executable, str(PYTHON / "examples" / "train_long.py"), "1024", "2"], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    assert out.count("step ") == 2 and "pages at most 16 K/V + 8 gradient of 16" in out
