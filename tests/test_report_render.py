"""Render the report in headless Chromium (Debian's `chromium` package): the page is not blank and every
figure loaded. Inputs are a small synthetic run written here; the report title says SYNTHETIC."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image as mpimg

from helpers import fake_simulator  # tests/ is on sys.path (pytest prepend mode)
from speclab.analyze.synthetic import write_synthetic_run
from speclab.report import build_report

CHROMIUM = os.environ.get("SPECLAB_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="chromium not installed (Debian: apt-get install -y chromium); cannot render the report",
)

# Appended to a copy of the report (never to the report itself): after the load event, record in the DOM
# how many images exist and how many decoded with a non-zero natural width.
IMG_CHECK = """
<script>
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0, bad = [];
  for (var i = 0; i < imgs.length; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; else bad.push(imgs[i].alt);
  }
  var d = document.createElement('div');
  d.id = 'speclab-img-check';
  d.setAttribute('data-total', String(imgs.length));
  d.setAttribute('data-ok', String(ok));
  d.setAttribute('data-bad', bad.join('|'));
  document.body.appendChild(d);
});
</script>
"""


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def image_check(tmp_path: Path, html: Path) -> tuple[int, int, str]:
    probe = tmp_path / f"probe-{html.stem}.html"
    probe.write_text(html.read_text().replace("</body>", IMG_CHECK + "</body>"))
    res = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    m = re.search(r'id="speclab-img-check" data-total="(\d+)" data-ok="(\d+)" data-bad="([^"]*)"', res.stdout)
    assert m, f"image check did not run; chromium rc={res.returncode} stderr tail: {res.stderr[-800:]}"
    return int(m.group(1)), int(m.group(2)), m.group(3)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("render")
    mp = pytest.MonkeyPatch()
    fake_simulator(mp)  # oracle bounds drawn without depending on the simulator's speed
    try:
        run = write_synthetic_run(tmp / "run", n_per_workload=8)
        path = build_report(tmp / "report", run=run, title="SYNTHETIC test data: speclab report render check")
    finally:
        mp.undo()
    return path


def test_screenshot_not_blank(report, tmp_path):
    shot = tmp_path / "shot.png"
    res = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,2400", report.as_uri())
    assert shot.exists(), f"no screenshot; chromium rc={res.returncode} stderr tail: {res.stderr[-800:]}"
    img = mpimg.imread(shot)[..., :3]
    assert img.shape[0] >= 2000 and img.shape[1] >= 1300
    gray = img.mean(axis=2)
    assert gray.std() > 0.05, "screenshot is (nearly) uniform: blank page?"
    assert (gray < 0.9).mean() > 0.02, "screenshot is almost all white"
    # colour present (plots), not just black text on white
    assert (np.ptp(img, axis=2) > 0.2).mean() > 0.005


def test_every_figure_loaded(report, tmp_path):
    n_png = len(list(report.parent.glob("*.png")))
    total, ok, bad = image_check(tmp_path, report)
    assert total == n_png == 7
    assert ok == total, f"figures that did not load: {bad}"


def test_image_check_detects_a_broken_figure(report, tmp_path):
    broken = tmp_path / "broken.html"
    html = report.read_text()
    broken.write_text(
        html.replace("</main>", '<img alt="broken-one" src="data:image/png;base64,AAAA"></main>')
    )
    total, ok, bad = image_check(tmp_path, broken)
    assert total == ok + 1 and bad == "broken-one"
