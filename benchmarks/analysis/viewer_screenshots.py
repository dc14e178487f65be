"""Screenshots of the trajectory viewer's views (docs/VIEWER.md), taken in headless Chromium.

    python benchmarks/analysis/viewer_screenshots.py --out docs/viewer \\
        --shot runs=results/babyai_gpu_f32,results/babyai_gpu_bf16#runs \\
        --shot browser=runs/cpu#episodes?run=0&sort=reward&order=desc \\
        --shot episode=runs/cpu#episode?run=0&file=0&row=3

Each ``--shot NAME=RUN_DIR[,RUN_DIR...]#HASH[@SCROLL]`` serves those runs, opens the page at
``#HASH``, scrolls to the element matching the CSS selector ``SCROLL`` (optional) and saves
``NAME.png`` (``--width`` x ``--height`` pixels; PNG palette-quantised to stay small).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agentrl_jax.viewer import Viewer  # noqa: E402
from agentrl_jax.viewer.server import BackgroundServer  # noqa: E402


def browser(width: int, height: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    from environments.miniwob.browser import CHROME_FLAGS, chrome_paths

    binary, driver_path = chrome_paths()
    options = webdriver.ChromeOptions()
    for flag in CHROME_FLAGS + (f"--window-size={width},{height}", "--hide-scrollbars"):
        options.add_argument(flag)
    options.binary_location = binary
    return webdriver.Chrome(service=Service(executable_path=driver_path, log_output=os.devnull),
                            options=options)


def save_small_png(png: bytes, path: str) -> int:
    """Quantise to a 256-colour palette (text and flat colours survive) and write."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB")
    img.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    return os.path.getsize(path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--shot", action="append", required=True,
                   help="NAME=RUN_DIR[,RUN_DIR...]#HASH[@CSS selector to scroll to]")
    p.add_argument("--width", type=int, default=1360)
    p.add_argument("--height", type=int, default=900)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    driver = browser(a.width, a.height)
    cache = tempfile.mkdtemp(prefix="viewer_shots_")
    try:
        for spec in a.shot:
            name, rest = spec.split("=", 1)
            runs, view = rest.split("#", 1)
            view, _, scroll = view.partition("@")
            viewer = Viewer(runs.split(","), cache_dir=cache)
            viewer.update()
            for r in viewer.runs:
                r.tokenizer()
            with BackgroundServer(viewer) as url:
                driver.get("about:blank")
                driver.get(url + "#" + view)
                time.sleep(3.0)  # data loaded, charts drawn
                if scroll:
                    driver.execute_script(
                        "const e = document.querySelector(arguments[0]);"
                        "if (e) window.scrollTo(0, e.getBoundingClientRect().top + scrollY - 50);",
                        scroll)
                    time.sleep(0.5)
                size = save_small_png(driver.get_screenshot_as_png(),
                                      os.path.join(a.out, f"{name}.png"))
            viewer.close()
            print(f"{name}.png: {size / 1e3:.0f} kB ({runs} #{view})", flush=True)
    finally:
        driver.quit()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
