"""Native extensions that crash a process when loaded in the wrong order (knowledge/index.py says which and why):
a process that imports the index module first, as a tool that searches before it embeds does, must live."""

from __future__ import annotations

import subprocess
import sys


def test_a_process_that_loads_the_index_before_onnxruntime_lives() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", "import ragsidecar.knowledge.index\nimport onnxruntime\nprint('alive')"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0 and loaded.stdout.strip() == "alive", loaded.stderr[-2000:]
