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

from helpers import fake_simulator, report_with_rows  # tests/ is on sys.path (pytest prepend mode)
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


def chromium(tmp_path: Path, *args: str, scrollbars: bool = False) -> subprocess.CompletedProcess:
    """Headless chromium; scrollbars: drawn as in a desktop window (they take their width from the page)."""
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
        *([] if scrollbars else ["--hide-scrollbars"]),
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


# After the load event: does the page, or any table, run wider than the window or its box? Records the page's
# widths, each table's last header (which table it is) and the ones that overflow.
WIDTH_CHECK = """
<script>
window.addEventListener('load', function () {
  var de = document.documentElement, bad = [], last = [];
  if (de.scrollWidth > de.clientWidth) bad.push('page ' + de.scrollWidth + ' > ' + de.clientWidth);
  var ts = document.querySelectorAll('table');
  for (var i = 0; i < ts.length; i++) {
    var t = ts[i], box = t.parentElement, hs = t.querySelectorAll('thead th');
    var name = hs.length ? hs[hs.length - 1].textContent : '?';
    last.push(name);
    var right = t.getBoundingClientRect().right;
    if (box.scrollWidth > box.clientWidth || right > box.getBoundingClientRect().right + 0.5
        || right > de.clientWidth)
      bad.push(name + ' table ' + Math.round(t.getBoundingClientRect().width) + ' px in ' + box.clientWidth);
  }
  var d = document.createElement('div');
  d.id = 'speclab-width-check';
  d.setAttribute('data-width', String(de.clientWidth));
  d.setAttribute('data-last', last.join('|'));
  d.setAttribute('data-bad', bad.join('|'));
  document.body.appendChild(d);
});
</script>
"""


def width_check(tmp_path: Path, html: Path, width: int) -> tuple[int, list[str], str]:
    """(the page's width inside the window, each table's last header, what overflows) in a desktop window
    `width` pixels wide, its vertical scrollbar drawn."""
    probe = tmp_path / f"width-{html.stem}.html"
    probe.write_text(html.read_text().replace("</body>", WIDTH_CHECK + "</body>"))
    res = chromium(
        tmp_path, f"--window-size={width},900", "--virtual-time-budget=10000", "--dump-dom", probe.as_uri(),
        scrollbars=True,
    )  # fmt: skip
    m = re.search(
        r'id="speclab-width-check" data-width="(\d+)" data-last="([^"]*)" data-bad="([^"]*)"', res.stdout
    )
    assert m, f"width check did not run; chromium rc={res.returncode} stderr tail: {res.stderr[-800:]}"
    return int(m.group(1)), m.group(2).split("|"), m.group(3)


def wide_rows(rows: list[dict]) -> list[dict]:
    """The synthetic rows made as wide as a run on a busy machine makes them: every SD cell measured three
    times with matched pairs that straddle 1.00x, one of them contended (so each recommendation says at
    length why it cannot tell), two n-gram entries that differ only in their options (labels carry the
    options), and a failed cell with a long error."""
    out = []
    for r in rows:
        r = dict(r)
        if r.get("status") == "ok" and r.get("method") not in (None, "none"):
            sp = float(r["speedup"])
            ratios = [min(sp, 1.0) * 0.96, max(sp, 1.0) * 1.04, sp]
            r["speedup_runs"] = [
                {"repeat": i + 1, "speedup": x, "contended": i == 2} for i, x in enumerate(ratios)
            ]
            r["repeats"] = 3
            r["speedup_spread"] = {
                "min": min(ratios[:2]),
                "max": max(ratios[:2]),
                "n": 2,
                "contended_left_out": 1,
            }
        out.append(r)
        if r.get("method") == "ngram":
            out.append(
                dict(
                    r,
                    cell_id=r["cell_id"] + "-wide",
                    method_options={"prompt_lookup_min": 2, "prompt_lookup_max": 5},
                )
            )
        if r.get("status") == "failed":
            r["error"] = (
                "engine start failed: RuntimeError: CPU KV cache of 2 GiB is too small for max_num_seqs=64 "
                "at max_model_len=2048 (VLLM_CPU_KVCACHE_SPACE)"
            )
    return out


@pytest.fixture(scope="module")
def wide_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wide")
    return report_with_rows(tmp, wide_rows, "SYNTHETIC test data: wide tables at 1,300 px", n_per_workload=8)[
        0
    ]


def test_tables_fit_a_1300_pixel_window(wide_report, tmp_path):
    html = wide_report.read_text()
    whys = re.findall(r"<td[^>]*>([^<]*straddles[^<]*)</td>", html)
    assert whys and max(len(w) for w in whys) > 150  # the recommendation's why column is long prose
    assert "prompt_lookup_max=5,prompt_lookup_min=2" in html
    width, last, bad = width_check(tmp_path, wide_report, 1300)
    assert width < 1300  # the page's vertical scrollbar is drawn and takes its share, as on a desktop
    assert "why" in last and "status" in last  # the recommendation and results tables were measured
    assert bad == "", f"overflowing at 1,300 px: {bad}"


def test_width_check_detects_a_table_too_wide(wide_report, tmp_path):
    wide = tmp_path / "too-wide.html"
    cells = "".join(f"<td>{'x' * 30}{i}</td>" for i in range(60))
    wide.write_text(wide_report.read_text().replace("</main>", f"<table><tr>{cells}</tr></table></main>"))
    _, _, bad = width_check(tmp_path, wide, 1300)
    assert bad.startswith("page ") and "table" in bad
