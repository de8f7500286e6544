"""The workbook as a newcomer meets it, in a real browser: ``make lab`` started headless on a free port (stopped by its
PID), Debian's Chromium driven through selenium.  Every stage notebook, opened by a double-click on its file-browser
entry, renders as a notebook (markdown rendered, kernel "Python 3 (dsv4-workbook)" idle) and is not marked modified; an
executed ``runs/`` notebook shows its figures and is trusted; STATUS.md opens as Markdown.  Screenshots go to
``runs/browser/`` for a person to look at.

Needs chromium + chromedriver (``scripts/bootstrap.sh`` installs Debian's where it can) and selenium; skips with a
one-line reason without them."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from dsv4lib.workbook.provenance import REPO_ROOT
from dsv4lib.workbook.registry import load_registry

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    import selenium  # noqa: F401
    HAVE_SELENIUM = True
except ImportError:
    HAVE_SELENIUM = False

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="no chromium + chromedriver on this machine "
                       "(apt-get install chromium chromium-driver; scripts/bootstrap.sh does where it can)"),
    pytest.mark.skipif(not HAVE_SELENIUM, reason="selenium is not installed (pip install selenium)"),
]

SHOTS = REPO_ROOT / "runs" / "browser"
EXECUTED = REPO_ROOT / "runs" / "browser-test"          # an executed stage notebook of this test's own
KERNEL = "Python 3 (dsv4-workbook)"
WAIT_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def executed_stage():
    """D0-ref (needs no GPU, draws figures) run by the pipeline into runs/browser-test/cpu/, with its report."""
    from dsv4lib.workbook.pipeline import run_stage
    from dsv4lib.workbook.reports import write_reports
    from dsv4lib.workbook.targets import Target

    stage = next(s for s in load_registry() if s.id == "D0-ref")
    row = run_stage(stage, Target("cpu", "cpu", "", None), EXECUTED / "cpu")
    assert row["verdict"] == "PASS", row["reason"]
    reports = write_reports(EXECUTED, "cpu", stage.id)
    assert len(reports["figures"]) >= 1
    return f"runs/browser-test/cpu/{stage.id}.ipynb", len(reports["figures"])


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``make lab`` as README says, headless on a free port, no token; a private workspace (no restored tabs)."""
    port = _free_port()
    env = dict(os.environ, JUPYTERLAB_WORKSPACES_DIR=str(tmp_path_factory.mktemp("workspaces")))
    log = open(tmp_path_factory.mktemp("lab") / "lab.log", "w")
    proc = subprocess.Popen(["make", "--no-print-directory", "lab",
                             f"ARGS=--no-browser --port {port} --IdentityProvider.token= --ServerApp.password="],
                            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    while True:
        try:
            _get_json(f"{base}/api/status")
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() - t0 > WAIT_S:
                os.killpg(proc.pid, signal.SIGKILL)
                pytest.fail(f"make lab did not serve on port {port}: {Path(log.name).read_text()[-2000:]}")
            time.sleep(0.5)
    yield base
    os.killpg(proc.pid, signal.SIGTERM)          # make, jupyter lab and its kernels: one process group
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900"):
        opts.add_argument(arg)
    opts.binary_location = CHROMIUM
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()


def _wait(what: str, fn, timeout: float = WAIT_S, browser=None, shot: str = "timeout"):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            value = fn()
        except Exception:  # noqa: BLE001 - the DOM changes under us while JupyterLab renders
            value = None
        if value:
            return value
        time.sleep(0.3)
    if browser is not None:
        browser.save_screenshot(str(SHOTS / f"{shot}.png"))
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what} (screenshot runs/browser/{shot}.png)")


def _by_css(driver, css: str):
    from selenium.webdriver.common.by import By
    return driver.find_elements(By.CSS_SELECTOR, css)


def _double_click_entry(driver, name: str) -> None:
    """Double-click the file-browser entry called ``name`` (in the folder the file browser shows now)."""
    from selenium.webdriver.common.action_chains import ActionChains

    def entry():
        for item in _by_css(driver, ".jp-DirListing-item"):
            if item.find_element("css selector", ".jp-DirListing-itemText").text.strip() == name:
                return item
    ActionChains(driver).double_click(_wait(f"file-browser entry {name}", entry, browser=driver)).perform()


def _go_to_folder(driver, base: str, folder: str) -> None:
    """The file browser at ``folder`` (repository-relative): JupyterLab's ``/lab/tree/<folder>`` URL opens a folder in
    the file browser (the files themselves are then opened by double-clicks); waits until its crumbs say so."""
    want = [p for p in folder.split("/") if p]
    # /lab/tree/ alone is "not found"; /lab would restore the workspace's folder: ?reset starts it afresh at the root
    driver.get(f"{base}/lab/tree/{folder}" if want else f"{base}/lab?reset")

    def there():
        crumbs = [c for c in _by_css(driver, ".jp-BreadCrumbs") if c.is_displayed()]
        return crumbs and [p.strip() for p in crumbs[0].text.split("/") if p.strip()] == want
    _wait(f"the file browser at /{folder}", there, browser=driver)
    _wait("the file browser's listing", lambda: _by_css(driver, ".jp-DirListing-item"), browser=driver)


def _current_tab(driver):
    tabs = [t for t in _by_css(driver, ".lm-DockPanel .lm-TabBar-tab") if "jp-mod-current" in t.get_attribute("class")]
    return tabs[0] if tabs else None


def _current_panel(driver):
    panels = [p for p in _by_css(driver, ".jp-MainAreaWidget") if "lm-mod-hidden" not in p.get_attribute("class")]
    return panels[0] if panels else None


def _close_current_tab(driver) -> None:
    tab = _current_tab(driver)
    if tab is not None:
        tab.find_element("css selector", ".lm-TabBar-tabCloseIcon").click()
        time.sleep(0.5)
        for button in _by_css(driver, ".jp-Dialog .jp-mod-warn"):      # "discard" if it ever asks: never save here
            button.click()


def test_stage_notebooks_open_as_notebooks_with_the_venv_kernel_idle_and_unmodified(lab, browser):
    stages = load_registry()
    problems = []
    for stage in stages:
        path = stage.notebook.relative_to(REPO_ROOT)
        _go_to_folder(browser, lab, str(path.parent))
        _double_click_entry(browser, path.name)
        panel = _wait(f"{path.name} as a notebook", lambda: (p := _current_panel(browser)) is not None
                      and "jp-NotebookPanel" in p.get_attribute("class") and p, browser=browser, shot=stage.id)
        _wait(f"{path.name}: rendered markdown", lambda: panel.find_elements(
            "css selector", ".jp-MarkdownCell .jp-RenderedMarkdown h1, .jp-MarkdownCell .jp-RenderedMarkdown h2"),
            browser=browser, shot=stage.id)
        _wait(f"{path.name}: kernel {KERNEL}", lambda: any(
            e.text.strip() == KERNEL for e in panel.find_elements("css selector", ".jp-Toolbar-kernelName")),
            browser=browser, shot=stage.id)
        _wait(f"{path.name}: kernel idle", lambda: any(
            KERNEL in e.text and "Idle" in e.text for e in _by_css(browser, ".jp-StatusBar-Widget *")),
            browser=browser, shot=stage.id)
        time.sleep(1.0)                       # metadata from the kernel's reply lands after "idle": then look
        browser.save_screenshot(str(SHOTS / f"{stage.id}.png"))
        if "jp-mod-dirty" in _current_tab(browser).get_attribute("class"):
            problems.append(f"{path.name} is marked modified right after opening")
        _close_current_tab(browser)
    assert not problems, problems


def test_an_executed_notebook_shows_its_figures_trusted_and_status_md_opens_as_markdown(lab, browser,
                                                                                       executed_stage):
    path, n_figures = executed_stage
    folder, name = path.rsplit("/", 1)
    _go_to_folder(browser, lab, folder)
    _double_click_entry(browser, name)
    images = _wait(f"{n_figures} figures of {name}", lambda: len(imgs := _by_css(
        browser, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img")) >= n_figures and imgs,
        browser=browser, shot="executed")
    assert all(int(img.get_attribute("naturalWidth") or 0) > 100 for img in images)      # really decoded PNGs
    browser.execute_script("arguments[0].scrollIntoView()", images[0])                  # the shot shows a figure
    time.sleep(1.0)
    browser.save_screenshot(str(SHOTS / "executed.png"))
    assert "jp-mod-dirty" not in _current_tab(browser).get_attribute("class"), f"{name} marked modified on open"
    model = _get_json(f"{lab}/api/contents/{path}?content=1")
    code_with_outputs = [c for c in model["content"]["cells"] if c["cell_type"] == "code" and c["outputs"]]
    assert code_with_outputs and all(c["metadata"].get("trusted") for c in code_with_outputs), "not trusted"
    _close_current_tab(browser)

    _go_to_folder(browser, lab, "")
    _double_click_entry(browser, "STATUS.md")
    panel = _wait("STATUS.md in the editor", lambda: (p := _current_panel(browser)) is not None
                  and "jp-FileEditor" in " ".join(e.get_attribute("class") for e in
                                                   p.find_elements("css selector", ".jp-FileEditor")) and p,
                  browser=browser, shot="status")
    assert "jp-NotebookPanel" not in panel.get_attribute("class")
    _wait("STATUS.md's text", lambda: "# STATUS" in panel.text, browser=browser, shot="status")
    browser.save_screenshot(str(SHOTS / "status.png"))
    _close_current_tab(browser)
