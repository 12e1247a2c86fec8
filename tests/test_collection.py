"""Any selection of the test folders collects: ``pytest tests/integration tests/pipeline`` as well as the
whole suite.

The folders are not packages, so every ``conftest.py`` is imported as the module ``conftest``, and a second
one replaces the first in ``sys.modules``: the tests that import helpers from the root one (``from conftest
import``) then fail to import, but only when a folder with its own ``conftest.py`` is collected in the same
command as theirs, and only in some orders. Collecting every folder, each named on the command line, catches
that at once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.timeout(120)
def test_every_test_folder_collects_in_one_command() -> None:
    folders = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "tests").iterdir()
                     if path.is_dir() and any(path.glob("test_*.py")))
    assert "tests/integration" in folders
    assert "tests/pipeline" in folders
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *reversed(folders)], cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " error" not in done.stdout.splitlines()[-1], done.stdout[-3000:]
