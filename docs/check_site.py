"""Open every page of the built documentation site in headless Chromium, as a reader's browser would.

Serves the site on localhost, loads each ``.html`` page through Selenium (Debian's ``chromium`` and
``chromium-driver``) and fails, listing every problem, when a page logs a console error, shows an image that did not
load, links to a page or anchor of the site that does not exist, or has a table wider than its column (see
:data:`WIDE_TABLES`). Writes screenshots of the front page and of the first tutorial. ``make docs-check`` runs it on
``build/site``.

    python docs/check_site.py build/site --screenshots build/site-check
"""

from __future__ import annotations

import argparse
import functools
import http.server
import shutil
import sys
import threading
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

# the pages whose screenshots are kept: the front page and a tutorial
SCREENSHOTS = {"index.html": "front_page.png", "tutorials/hmc_vs_vi_regression.html": "tutorial.png"}
# the browser window the pages are measured in: a laptop's (docs/stylesheets/extra.css sizes the column for it)
WINDOW = (1280, 1600)

# Every table of a page's content column (Material's .md-content, between the navigation and the window's edge; the
# page's body where there is none) that a reader cannot see all of: one that runs past the column's right edge, one
# that an ancestor cuts off (overflow hidden), or one whose scroll box itself runs past the column. A table wider
# than the column that scrolls sideways inside its own box within the column (Material's wrapper around a Markdown
# table, a notebook's output area, the table itself) is not wider than its column: all of it can be scrolled to.
# Returns [table's number on the page, its first row's text, its width, the column's width, what is wrong], and the
# number of tables that scroll in their box.
WIDE_TABLES = """
const column = document.querySelector('.md-content') || document.body;
const edge = column.getBoundingClientRect().right + 1;  // a pixel of rounding
const wide = []; let scrolled = 0;
Array.from(column.querySelectorAll('table')).forEach((table, i) => {
  const rect = table.getBoundingClientRect();
  const right = rect.left + Math.max(table.scrollWidth, rect.width);  // the right edge of all of the table
  // the innermost box, the table's own included, whose overflow hides some of the table: it scrolls or cuts it off
  let box = table, wrong = null;
  for (; box !== column; box = box.parentElement) {
    const r = box.getBoundingClientRect(), overflow = getComputedStyle(box).overflowX;
    const hides = box === table ? table.scrollWidth > table.clientWidth + 1
                                : right > r.left + box.clientLeft + box.clientWidth + 1;
    if (overflow !== 'visible' && hides) {
      if (overflow !== 'auto' && overflow !== 'scroll') wrong = 'is cut off (overflow: ' + overflow + ')';
      else if (r.right > edge) wrong = 'its scroll box runs past the column';
      else scrolled += 1;
      break;
    }
  }
  if (box === column && right > edge) wrong = 'runs past the column';
  if (wrong) wide.push([i + 1, (table.rows[0] ? table.rows[0].innerText : '').replace(/\\s+/g, ' ').slice(0, 60),
                        Math.round(right - rect.left), Math.round(column.getBoundingClientRect().width), wrong]);
});
return [wide, scrolled];
"""


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A quiet HTTP server for ``site`` on a free localhost port, running in a daemon thread."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def browser() -> webdriver.Chrome:
    """Headless Chromium with its console log readable."""
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size={},{}".format(*WINDOW)):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"))


def anchors_of(driver: webdriver.Chrome) -> set[str]:
    return set(driver.execute_script("return Array.from(document.querySelectorAll('[id]'), e => e.id)"))


def check(site: Path, screenshots: Path | None) -> list[str]:
    """Every problem found on every page of ``site``, as ``page: what``."""
    pages = sorted(str(p.relative_to(site)) for p in site.rglob("*.html") if p.name != "404.html")
    server, root = serve(site)
    driver = browser()
    problems: list[str] = []
    links: list[tuple[str, str, str]] = []  # (page, target page, anchor)
    anchors: dict[str, set[str]] = {}
    scrolled = 0  # tables wider than the column that scroll in their own box
    try:
        for page in pages:
            driver.get(root + page)
            for entry in driver.get_log("browser"):
                if entry["level"] == "SEVERE":
                    problems.append(f"{page}: console error: {entry['message']}")
            broken = driver.execute_script(
                "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
                ".map(i => i.getAttribute('src'))")
            problems += [f"{page}: image did not load: {src}" for src in broken]
            wide, in_box = driver.execute_script(WIDE_TABLES)
            problems += [f"{page}: table wider than its column: table {n} ({row!r}), {width} px in a {column} px "
                         f"column, {wrong}" for n, row, width, column, wrong in wide]
            scrolled += in_box
            anchors[page] = anchors_of(driver)
            for href in driver.execute_script("return Array.from(document.querySelectorAll('a[href]'), a => a.href)"):
                url, fragment = urldefrag(href)
                if not url.startswith(root):
                    continue  # another site
                target = unquote(urlparse(url).path).lstrip("/") or "index.html"
                if target.endswith("/"):
                    target += "index.html"
                links.append((page, target, fragment))
            if screenshots is not None and page in SCREENSHOTS:
                screenshots.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(screenshots / SCREENSHOTS[page]))
    finally:
        driver.quit()
        server.shutdown()
    for page, target, fragment in sorted(set(links)):
        if not (site / target).is_file():
            problems.append(f"{page}: link to a missing page: {target}")
        elif fragment and target in anchors and fragment not in anchors[target]:
            problems.append(f"{page}: link to a missing anchor: {target}#{fragment}")
    missing = [name for page, name in SCREENSHOTS.items() if page not in pages]
    problems += [f"no page for the screenshot {name}" for name in missing]
    print(f"{len(pages)} pages, {len(set(links))} internal links checked in headless Chromium at "
          f"{WINDOW[0]}x{WINDOW[1]} px ({scrolled} table(s) wider than the column scroll in their own box); "
          f"{len(problems)} problem(s)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=Path, help="the built site (mkdocs build's site_dir)")
    parser.add_argument("--screenshots", type=Path, default=None, help="where the screenshots go")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"{args.site}: no index.html; build the site first (make docs)", file=sys.stderr)
        return 2
    problems = check(args.site, args.screenshots)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
