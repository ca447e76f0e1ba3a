"""Helpers shared by the report tests: headless Debian chromium on a local page."""

import subprocess
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")


NO_CHROMIUM = "needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"


def chromium(page: Path, profile: Path, *args: str, size=(1400, 2400)) -> subprocess.CompletedProcess:
    """Headless Debian chromium on a local page: no network, no sandbox (CI runs as root), ``size`` window."""
    flags = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"]
    flags += ["--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]
    flags += [f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]
    flags += ["--virtual-time-budget=10000", f"--window-size={size[0]},{size[1]}", *args, page.as_uri()]
    return subprocess.run(flags, capture_output=True, text=True, timeout=90)
