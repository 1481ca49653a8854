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
    assert "5 snippet(s) match" in out.stdout


def test_the_example_trains():
    out = subprocess.run([sys.executable, str(PYTHON / "examples" / "train_long.py"), "1024", "2"], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    assert out.count("step ") == 2 and "pages at most 16 K/V + 8 gradient of 16" in out


def test_the_trainer_example_trains(tmp_path):
    for extra in ([], ["--lora"], ["--packed"]):
        out_dir = tmp_path / (extra[0][2:] if extra else "full")
        run = subprocess.run([sys.executable, str(PYTHON / "examples" / "train_trainer.py"), str(out_dir)] + extra,
                             check=True, capture_output=True, text=True, timeout=300)
        assert run.stdout.count("'loss'") + run.stderr.count("'loss'") >= 4
        assert (out_dir / "checkpoint-2").is_dir() and (out_dir / "checkpoint-4").is_dir()
