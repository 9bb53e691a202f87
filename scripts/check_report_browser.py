"""Open a study report in a real browser (headless Chromium) and check that the figure and the tables render.

Usage: python scripts/check_report_browser.py runs/tiny/report.html [--screenshot shot.png]

Needs Debian's chromium (``apt-get install chromium``; no network is used: the page is one self-contained file).
Checks: the DOM after loading holds the tables and one embedded image, and the screenshot shows the figure's bars
(matplotlib's default blue, #1f77b4). tests/test_study.py::test_report_renders_in_a_real_browser runs it when
chromium is installed.
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def check(report: Path, screenshot: Path) -> dict:
    import numpy as np
    from matplotlib.image import imread

    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium on PATH (apt-get install chromium)")
    url = report.resolve().as_uri()
    with tempfile.TemporaryDirectory() as profile:
        flags = FLAGS + [f"--user-data-dir={profile}"]
        dom = subprocess.run([exe, *flags, "--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        subprocess.run([exe, *flags, f"--screenshot={screenshot}", "--window-size=1400,2400", url],
                       capture_output=True, text=True, timeout=120, check=True)
    img = imread(screenshot)[..., :3]
    blue = np.abs(img - np.array([0x1F, 0x77, 0xB4]) / 255).max(-1) < 0.04
    out = {"tables": dom.count("<table>"), "images": dom.count("<img"), "rows": dom.count("<tr>"),
           "screenshot": str(screenshot), "size": img.shape[:2], "blue_pixels": int(blue.sum())}
    ok = out["tables"] >= 4 and out["images"] == 1 and out["blue_pixels"] > 200
    out["ok"] = bool(ok)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report")
    ap.add_argument("--screenshot", default="report_screenshot.png")
    a = ap.parse_args()
    res = check(Path(a.report), Path(a.screenshot))
    print(res)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
