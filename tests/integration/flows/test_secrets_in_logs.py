"""Secrets never reach the console or Prefect's database: every log handler the CLI sets up masks them
(the one redaction point, infra/core/redact.py), and so does the command's error line."""

import sqlite3
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration
SIG = "SuperSecretSig0123456789abcdefghij%3D"
LEAKY_FLOW = f"""
import sys
from pathlib import Path
from cli.services import prefect_api

with prefect_api(Path(sys.argv[1])):
    from prefect import flow, get_run_logger

    @flow
    def leaky():
        get_run_logger().warning("fetching https://acct.blob.core.windows.net/c/x?sv=2024-11-04&sp=r&sig={SIG}")

    leaky()
"""


def test_a_secret_logged_by_a_flow_is_masked_on_the_console_and_in_prefects_database(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", LEAKY_FLOW, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert SIG not in done.stdout + done.stderr and "sig=***" in done.stderr
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        messages = [row[0] for row in db.execute("select message from log")]
    assert any("sig=***" in m for m in messages) and not any(SIG in m for m in messages)
