"""Screenshot of the MLflow UI's training-runs view for one experiment (docs/mlflow_ui.png was made with it).

    .venv/bin/python scripts/mlflow_ui_screenshot.py sqlite:////abs/mlflow.db smoke docs/mlflow_ui.png

Serves the UI on 127.0.0.1 only, on a free port, drives headless Chromium (Debian's `chromium` package) over
the DevTools protocol (aiohttp, already installed with DVC) to unfold the sweep's parent run so that its jobs'
names show, saves the PNG, and stops both processes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

import aiohttp
from mlflow.tracking import MlflowClient

# The runs table as a person would set it up before looking: each sweep's parent unfolded, the Run Name column
# wide enough for the names, the key metrics as columns, the assistant side panel closed. MLflow keeps this
# view state in the browser's localStorage (key below, as MLflow 3.17 writes it); it is set, then the page
# reloaded.
VIEW_STATE_KEY = 'MLflowLocalStorage-1.1-ExperimentPage-["{id}"]-ReactComponentState'
METRIC_COLUMNS = ("best/val_loss", "best/predicted_tau", "bench/tau", "bench/speedup")
SET_VIEW = """
((key, patch) => {{
  const state = JSON.parse(localStorage.getItem(key) || '{{}}');
  Object.assign(state, patch);
  localStorage.setItem(key, JSON.stringify(state));
  localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false');
  return Object.keys(patch).join(', ');
}})({key}, {patch})
"""

# MLflow pins the Run Name column at a fixed width that cuts names like `samples=6400 epochs=16`; the pinned
# block is widened in place (what dragging its edge would do, were it resizable), shifting the columns after it.
WIDEN_RUN_NAME = """
((extra) => {
  const name = [...document.querySelectorAll('[col-id]')].filter(e => e.getAttribute('col-id').includes('Run Name'));
  if (!name.length) return 'no Run Name column';
  const edge = parseFloat(name[0].style.left || 0) + parseFloat(name[0].style.width);
  for (const block of document.querySelectorAll('.ag-pinned-left-cols-container, .ag-pinned-left-header')) {
    const width = (parseFloat(block.style.width) + extra) + 'px';
    Object.assign(block.style, {width: width, minWidth: width, maxWidth: width});
    for (const row of block.querySelectorAll('.ag-header-row, .ag-row')) {
      if (row.style.width) row.style.width = (parseFloat(row.style.width) + extra) + 'px';
    }
    for (const cell of block.querySelectorAll('[col-id]')) {
      if (cell.getAttribute('col-id').includes('Run Name')) cell.style.width = (parseFloat(cell.style.width) + extra) + 'px';
      else if (parseFloat(cell.style.left || 0) >= edge - 1) cell.style.left = (parseFloat(cell.style.left) + extra) + 'px';
    }
  }
  return `Run Name column widened by ${extra} px`;
})(%d)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, seconds: float) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {seconds:.0f} s")


async def capture(devtools_port: int, url: str, experiment_id: str, view: dict, out: Path, width: int,
                  height: int) -> None:
    pages = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{devtools_port}/json/list", timeout=5).read())
    ws_url = next(p["webSocketDebuggerUrl"] for p in pages if p.get("type") == "page")
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        counter = 0

        async def call(method, **params):
            nonlocal counter
            counter += 1
            await ws.send_json({"id": counter, "method": method, "params": params})
            async for message in ws:
                data = json.loads(message.data)
                if data.get("id") == counter:
                    return data.get("result", {})

        await call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                   mobile=False)
        await call("Page.navigate", url=url)
        await asyncio.sleep(8)  # the app writes its default view state on first load
        script = SET_VIEW.format(key=json.dumps(VIEW_STATE_KEY.format(id=experiment_id)), patch=json.dumps(view))
        result = await call("Runtime.evaluate", expression=script, returnByValue=True)
        print("view state set:", result.get("result", {}).get("value"))
        await call("Page.reload")
        await asyncio.sleep(12)  # the single-page app fetches runs after it loads
        result = await call("Runtime.evaluate", expression=WIDEN_RUN_NAME % 110, returnByValue=True)
        print(result.get("result", {}).get("value"))
        await asyncio.sleep(1)
        shot = await call("Page.captureScreenshot", format="png")
        out.write_bytes(base64.b64decode(shot["data"]))


def main(uri: str, experiment: str, out: str, width: int = 1600, height: int = 480) -> None:
    exp = MlflowClient(uri).get_experiment_by_name(experiment)
    if exp is None:
        sys.exit(f"no experiment {experiment!r} in {uri}")
    ui_port, devtools_port = free_port(), free_port()
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen([str(mlflow), "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
                               "--port", str(ui_port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    profile = tempfile.TemporaryDirectory()
    browser = None
    try:
        wait_http(f"http://127.0.0.1:{ui_port}/health", 90)
        browser = subprocess.Popen(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                                    "--hide-scrollbars", f"--user-data-dir={profile.name}",
                                    f"--remote-debugging-port={devtools_port}", "--remote-debugging-address=127.0.0.1",
                                    f"--window-size={width},{height}", "about:blank"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_http(f"http://127.0.0.1:{devtools_port}/json/version", 30)
        # the model-training sidebar; runs oldest first, so a sweep's jobs read in their order
        query = urllib.parse.urlencode({"workflowType": "machine_learning", "orderByKey": "attributes.start_time",
                                        "orderByAsc": "true"})
        url = f"http://127.0.0.1:{ui_port}/#/experiments/{exp.experiment_id}/runs?{query}"
        parents = MlflowClient(uri).search_runs([exp.experiment_id], "tags.`draftlab.role` = 'sweep'")
        view = {"runsExpanded": {r.info.run_id: True for r in parents},
                "columnWidths": {"attributes.`Run Name`": 300},
                "selectedColumns": [f"metrics.`{m}`" for m in METRIC_COLUMNS]}
        asyncio.run(capture(devtools_port, url, exp.experiment_id, view, Path(out), width, height))
        print(f"saved {out} ({url})")
    finally:
        for process in (browser, server):
            if process is not None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
        profile.cleanup()


if __name__ == "__main__":
    main(*sys.argv[1:4])
