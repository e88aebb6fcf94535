"""TLS checked by tools nobody here wrote (docs/TLS.md, "Checked by scanners"): sslyze finds the
server compliant with Mozilla's "intermediate" configuration, and testssl.sh reports no HIGH or
CRITICAL finding. Each test skips, saying why, when its tool is not installed: sslyze comes with
tests/requirements.txt (PyPI), testssl.sh is the Debian package `testssl.sh` (`apt-get install
testssl.sh`, as CI does).

The certificate is what a real deployment presents: a chain to an authority the scanner is told
to trust, 90 days long, with a revocation list's address."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import HOST, Server
from tls_certs import Authority

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def scanned(tmp_path: Path, maitred_server: Callable[..., Server]) -> tuple[Server, Authority]:
    authority = Authority(tmp_path, crl_url="http://127.0.0.1/maitred-test-ca.crl")
    pair = authority.server(days=90)
    server = maitred_server(
        "--certfile", str(pair.cert), "--keyfile", str(pair.key), "--chdir", str(EXAMPLES), "hello:app"
    )
    return server, authority


def test_sslyze_finds_mozilla_intermediate_compliance(scanned: tuple[Server, Authority]) -> None:
    """docs/TLS.md, "Checked by scanners": sslyze --mozilla_config=intermediate passes."""
    pytest.importorskip("sslyze", reason="sslyze is not installed: make test installs it from tests/requirements.txt")
    server, authority = scanned
    scan = subprocess.run(
        [
            sys.executable,
            "-m",
            "sslyze",
            f"--certinfo_ca_file={authority.pem}",
            "--mozilla_config=intermediate",
            f"{HOST}:{server.port}",
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=300,
    )
    assert """Checking results against Mozilla's "intermediate" configuration""" in scan.stdout, scan.stdout
    assert f"{HOST}:{server.port}: OK - Compliant." in scan.stdout, scan.stdout
    assert scan.returncode == 0, scan.stdout


def test_testssl_reports_no_high_or_critical_finding(scanned: tuple[Server, Authority], tmp_path: Path) -> None:
    """docs/TLS.md, "Checked by scanners": testssl.sh --fast finds nothing HIGH or CRITICAL."""
    testssl = shutil.which("testssl") or shutil.which("testssl.sh")
    if testssl is None:
        pytest.skip("testssl.sh is not installed: apt-get install testssl.sh (Debian)")
    server, authority = scanned
    report = tmp_path / "testssl.json"
    subprocess.run(
        [
            testssl,
            "--quiet",
            "--color",
            "0",
            "--fast",
            "--add-ca",
            str(authority.pem),
            "--jsonfile",
            str(report),
            f"{HOST}:{server.port}",
        ],
        capture_output=True,
        check=False,
        timeout=600,
    )
    findings = json.loads(report.read_text())
    assert any(finding["id"] == "TLS1_3" for finding in findings), findings
    severe = [finding for finding in findings if finding["severity"] in ("HIGH", "CRITICAL")]
    assert not severe, severe
