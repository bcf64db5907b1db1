#!/usr/bin/env python3
"""Drives the console in a real headless browser (chromium through chromium-driver).

Run by tests/it/console.rs, which starts the server and makes the requests, with one JSON
argument: {"base", "token", "ids": {...}, "workflow", "shots"}. Every check that fails is
printed; the exit status is the number of failures (0: all passed). Screenshots of the
pages go to `shots`.
"""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

ARGS = json.loads(sys.argv[1])
BASE = ARGS["base"]
IDS = ARGS["ids"]
SHOTS = ARGS["shots"]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        print("FAIL:", what, flush=True)


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    for a in ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,1000", "--lang=en-US"]:
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver"))
    return webdriver.Chrome(service=service, options=opts)


d = browser()
d.set_page_load_timeout(30)


def errors():
    """Script errors and refused loads the page logged (CSP violations included)."""
    return [e for e in d.get_log("browser") if e.get("level") == "SEVERE"]


def load(path, expect_errors=False):
    d.get(BASE + path)
    errs = errors()
    if not expect_errors:
        check(not errs, f"{path}: the page logged errors: {errs}")
    return d.page_source


def text():
    return d.find_element(By.TAG_NAME, "main").text


def shot(name, width=1280):
    d.set_window_size(width, 1000)
    h = d.execute_script("return document.documentElement.scrollHeight")
    # The window is the viewport plus the browser's own frame.
    d.set_window_size(width, min(max(h + 140, 600), 4000))
    d.save_screenshot(os.path.join(SHOTS, name + ".png"))
    d.set_window_size(1280, 1000)


def click(el):
    """Clicks a submit button and waits for the page it leads to."""
    el.click()

    def gone(_):
        # The old page's button is detached once the next page replaced it; while the
        # navigation is under way chromedriver may report that in more than one way.
        try:
            el.is_enabled()
            return False
        except WebDriverException:
            return True

    WebDriverWait(d, 15).until(gone)
    WebDriverWait(d, 15).until(lambda drv: drv.execute_script("return document.readyState") == "complete")


def no_xss(where):
    check(d.execute_script("return window.xssRan === undefined"), f"{where}: an injected script ran")
    check(not d.find_elements(By.CSS_SELECTOR, "main img, main script"),
          f"{where}: user data became markup")


def submit(form_action_suffix):
    form = d.find_element(By.CSS_SELECTOR, f"form[action$='{form_action_suffix}']")
    return form


# 1. Signing in: asked once per browser session; a wrong token is refused.
load("/console")
check("/console/login" in d.current_url, f"not sent to sign in: {d.current_url}")
d.find_element(By.NAME, "token").send_keys("not-the-token")
click(d.find_element(By.CSS_SELECTOR, "form[action^='/console/login'] button"))
check("not accepted" in text(), "a wrong token was not refused")
errors()  # the refusal is a 401, which the browser logs
shot("console-sign-in")
d.find_element(By.NAME, "token").send_keys(ARGS["token"])
click(d.find_element(By.CSS_SELECTOR, "form[action^='/console/login'] button"))
check(d.current_url.rstrip("/").endswith("/console"), f"signing in led to {d.current_url}")

# 2. The requests page: every request, counts by status, filters.
load("/console")
body = text()
for name, rid in IDS.items():
    check(rid in body, f"/console does not list the {name} request {rid}")
for status in ["COMPLETED", "FAILED", "PAUSED"]:
    check(status in d.find_element(By.CSS_SELECTOR, ".counts").text, f"no {status} count")
no_xss("/console")
shot("console-requests")
d.find_element(By.CSS_SELECTOR, "input[name=status][value=FAILED]").click()
click(d.find_element(By.CSS_SELECTOR, "form.filters button"))
badges = [b.text for b in d.find_elements(By.CSS_SELECTOR, "table.requests .badge")]
check(badges and set(badges) == {"FAILED"}, f"the FAILED filter showed {badges}")
check("status=FAILED" in d.current_url, "the filter is not in the link")

# 3. A request that failed after retries: its attempts and timeline.
load(f"/console/serviceRequests/{IDS['failed_after_retries']}")
body = text()
check("FAILED" in body and "after 3 attempts" in body, "the failed request's reason or attempts are missing")
cells = [c.text for c in d.find_elements(By.CSS_SELECTOR, "table.steps td.num")]
check("3" in cells, f"the step's 3 attempts are not shown: {cells}")
check(len(d.find_elements(By.CSS_SELECTOR, "svg.timeline rect")) >= 1, "no timeline bar")
shot("console-request-failed")

# 4. A step waiting to be tried again: the pending retry.
load(f"/console/serviceRequests/{IDS['retry_pending']}")
check("Pending retry" in text(), "the pending retry is not shown")

# 5. User data stays text: the payload holds markup and scripts.
load(f"/console/serviceRequests/{IDS['xss']}")
payload = d.find_element(By.CSS_SELECTOR, "main > pre.json").text
check("<img src=x onerror=" in payload and "<script>" in payload, f"the payload is not shown as text: {payload}")
headers = d.find_element(By.CSS_SELECTOR, "table.headers").text
check("x-note" in headers and "<script>" in headers, f"the forwarded header is not shown as text: {headers}")
no_xss("request page")
for s in d.find_elements(By.TAG_NAME, "summary"):
    s.click()
no_xss("request page, details open")

# 6. Forgery: a page of another site that posts the cancel form is refused.
class Evil(BaseHTTPRequestHandler):
    def do_GET(self):
        page = (f"<!doctype html><form method=post action='{BASE}/console/serviceRequests/"
                f"{IDS['paused']}/cancel'><input name=csrf value=guess><input name=reason value=forged>"
                "</form><script>document.forms[0].submit()</script>").encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(page)))
        self.end_headers()
        self.wfile.write(page)

    def log_message(self, *a):
        pass


evil = ThreadingHTTPServer(("127.0.0.1", 0), Evil)
threading.Thread(target=evil.serve_forever, daemon=True).start()
d.get(f"http://localhost:{evil.server_address[1]}/")
# The page posts its form as soon as it loads.
for _ in range(100):
    if "/console/" in d.current_url and d.execute_script("return document.readyState") == "complete":
        break
    time.sleep(0.1)
check("/console/" in d.current_url, f"the forged form did not post: {d.current_url}")
check("Forbidden" in d.page_source or "Unauthorized" in d.page_source,
      "the forged cancel was not refused")
errors()
evil.shutdown()
load(f"/console/serviceRequests/{IDS['paused']}")
check("PAUSED" in d.find_element(By.CSS_SELECTOR, "dl.facts").text, "the forged cancel took effect")
shot("console-request-paused")

# 7. Actions in the page: cancel the paused request.
form = submit("/cancel")
form.find_element(By.NAME, "reason").send_keys("stopped from the console <b>now</b>")
click(form.find_element(By.TAG_NAME, "button"))
check("Cancelled." in text(), "no word that the cancel happened")
check("CANCELLED" in d.find_element(By.CSS_SELECTOR, "dl.facts").text, "the request is not CANCELLED")
check("<b>now</b>" in text(), "the reason is not shown as text")
errors()

# 8. Retry the request whose downstream is fixed now; it completes.
load(f"/console/serviceRequests/{IDS['fixable']}")
click(submit("/retry").find_element(By.TAG_NAME, "button"))
check("Retried" in text(), "no word that the retry happened")
status = ""
for _ in range(40):
    load(f"/console/serviceRequests/{IDS['fixable']}")
    status = d.find_element(By.CSS_SELECTOR, "dl.facts .badge").text
    if status == "COMPLETED":
        break
    time.sleep(0.5)
check(status == "COMPLETED", f"the retried request is {status}")
shot("console-request-retried")

# 9. Rerun a completed request from its second step.
load(f"/console/serviceRequests/{IDS['completed']}")
form = submit("/rerun")
form.find_element(By.CSS_SELECTOR, "select[name=fromStep] option[value='2']").click()
click(form.find_element(By.TAG_NAME, "button"))
check("Rerun of" in text(), "the rerun's page does not name its origin")
rerun_id = d.current_url.split("/console/serviceRequests/")[-1].split("?")[0]
check(rerun_id != IDS["completed"], "no new request for the rerun")
for _ in range(40):
    load(f"/console/serviceRequests/{rerun_id}")
    if d.find_element(By.CSS_SELECTOR, "dl.facts .badge").text == "COMPLETED":
        break
    time.sleep(0.5)
check(len(d.find_elements(By.CSS_SELECTOR, "svg.timeline rect.copied")) == 1, "the copied step is not drawn as a copy")
shot("console-request-rerun")
load(f"/console/serviceRequests/{IDS['completed']}")
check(rerun_id in text(), "the original does not link its rerun")

# 10. Workflows: the list, a definition, its requests per minute.
load("/console/workflows")
check(ARGS["workflow"] in text(), "the workflow is not listed")
no_xss("/console/workflows")
shot("console-workflows")
load(f"/console/workflows/{ARGS['workflow']}")
body = text()
for step in ["validate", "pay"]:
    check(step in body, f"the step {step} is not shown")
check(len(d.find_elements(By.CSS_SELECTOR, "svg.per-minute rect")) >= 1, "no bar in the per-minute chart")
no_xss("workflow page")
shot("console-workflow")

# 11. A phone-sized screen: nothing wider than the screen.
for path in ["/console", f"/console/serviceRequests/{IDS['fixable']}", f"/console/workflows/{ARGS['workflow']}"]:
    d.set_window_size(390, 844)
    load(path)
    over = d.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
    check(over <= 1, f"{path} is {over}px wider than a phone's screen")
d.set_window_size(390, 844)
load(f"/console/serviceRequests/{IDS['fixable']}")
shot("console-phone", width=390)

# 12. Signing out ends the session.
load("/console")
click(d.find_element(By.CSS_SELECTOR, "form.signout button"))
load("/console")
check("/console/login" in d.current_url, "signing out did not end the session")

d.quit()
print(json.dumps({"failures": failures, "rerun": rerun_id}))
sys.exit(min(len(failures), 100))
