"""The browser view in a real browser: the page loads from the server's embedded assets,
generates from a prompt on the embedded model, draws the attention grid (layers x heads), the
lens table (layers x tokens) and the patching sweep, each the size the API says; a screenshot
is saved."""

import json
import os
import pathlib
import urllib.request

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

SCREENSHOTS = pathlib.Path(os.environ.get("HOOKSCOPE_SCREENSHOTS", "target/browser"))


def api(url, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as answer:
        return json.load(answer)


def wait_for_state(driver, *states):
    WebDriverWait(driver, 120).until(
        lambda d: d.execute_script("return document.body.dataset.state") in states)
    state = driver.execute_script("return document.body.dataset.state")
    return state, driver.find_element(By.ID, "status").text


def test_the_view_generates_and_draws_every_panel(server, browser):
    model = api(server, "/v1/model")
    browser.get(server + "/")
    state, status = wait_for_state(browser, "ready", "error")
    assert state == "ready", status
    assert model["architecture"] in browser.find_element(By.ID, "model-info").text

    prompt = browser.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("In the beginning God created")
    new_tokens = browser.find_element(By.ID, "new-tokens")
    new_tokens.clear()
    new_tokens.send_keys("4")
    browser.find_element(By.ID, "run").click()
    state, status = wait_for_state(browser, "done", "error")
    assert state == "done", status

    # The same generation through the API: the page shows its tokens and continuation.
    generation = api(server, "/v1/run", {"prompts": ["In the beginning God created"],
                                         "max_new_tokens": 4, "greedy": True})["prompts"][0]
    ids = generation["input_ids"] + generation["new_ids"]
    tokens = browser.find_elements(By.CSS_SELECTOR, "#tokens .token")
    assert len(tokens) == len(ids)
    generated = browser.find_elements(By.CSS_SELECTOR, "#tokens .token.generated")
    assert "".join(t.text for t in generated).strip() == generation["continuation"].strip()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#predictions tr")) == 4

    # Attention: one cell per layer and head, as the site table says.
    sites = api(server, f"/v1/sites?prompt_len={len(ids)}")["sites"]
    patterns = [s for s in sites if s["name"].endswith("self_attn.attention_probabilities")]
    heads = patterns[0]["step0"][1]
    cells = browser.find_elements(By.CSS_SELECTOR, "#attention-grid .head-cell")
    assert len(cells) == len(patterns) * heads
    assert {(c.get_attribute("data-layer"), c.get_attribute("data-head")) for c in cells} == {
        (str(layer), str(head)) for layer in range(len(patterns)) for head in range(heads)}
    # Clicking a head enlarges it; hovering a token shades what it attends to.
    cells[-1].click()
    title = browser.find_element(By.ID, "attention-focus-title").text
    assert title == f"layer {len(patterns) - 1} head {heads - 1}"
    hovered = browser.find_elements(By.CSS_SELECTOR, "#attention-tokens .token")[-1]
    browser.execute_script(
        "arguments[0].dispatchEvent(new MouseEvent('mouseenter'))", hovered)
    shaded = [t.get_attribute("style") for t in
              browser.find_elements(By.CSS_SELECTOR, "#attention-tokens .token")]
    assert all("background" in style for style in shaded)

    # The lens: a row per layer, a cell per token, each cell the API's top token.
    lens = api(server, "/v1/lens", {"input_ids": ids})
    rows = browser.find_elements(By.CSS_SELECTOR, "#lens-table tr.lens-row")
    assert len(rows) == model["layers"]
    for row, layer in zip(rows, lens["layers"]):
        cells = row.find_elements(By.CSS_SELECTOR, "td.lens-cell")
        assert len(cells) == len(ids)
        assert [c.text for c in cells] == [json.dumps(p["top"][0]["token"])
                                           for p in layer["positions"]]

    # Patching with the form's defaults (the README's example): one row per layer.
    browser.find_element(By.ID, "patch-run").click()
    state, status = wait_for_state(browser, "patched", "error")
    assert state == "patched", status
    patch_rows = browser.find_elements(By.CSS_SELECTOR, "#patch-table tr.patch-row")
    assert len(patch_rows) == model["layers"]

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / "view.png"
    assert browser.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 10_000


def test_features_show_per_token_with_a_dictionary_attached(server_with_sae, browser):
    server = server_with_sae
    browser.get(server + "/")
    state, status = wait_for_state(browser, "ready", "error")
    assert state == "ready", status
    assert browser.find_element(By.ID, "features").is_displayed()
    new_tokens = browser.find_element(By.ID, "new-tokens")
    new_tokens.clear()
    new_tokens.send_keys("0")
    browser.find_element(By.ID, "run").click()
    state, status = wait_for_state(browser, "done", "error")
    assert state == "done", status

    prompt = browser.find_element(By.ID, "prompt").get_attribute("value")
    features = api(server, "/v1/features", {"prompt": prompt})
    [dictionary] = features["dictionaries"]
    assert dictionary["site"] == "layers.1.layer_output" and dictionary["width"] == 32
    rows = browser.find_elements(By.CSS_SELECTOR, "#features-body tr.feature-row")
    assert len(rows) == len(features["tokens"])
    for row, token in zip(rows, dictionary["tokens"]):
        shown = row.find_elements(By.TAG_NAME, "td")[1].text
        assert shown.split() == " ".join(
            f"#{f['index']} {f['activation']:.2f}" for f in token["features"]).split()
    # A trace (no new tokens) shows the prompt's own next-token predictions.
    assert len(browser.find_elements(By.CSS_SELECTOR, "#predictions tr")) == 1
