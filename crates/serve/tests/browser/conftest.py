"""Fixtures of the browser test: a `hookscope serve` process on an ephemeral port, and a
headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`)."""

import json
import os
import shutil
import subprocess
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[4]


def _required():
    """CI sets HOOKSCOPE_REQUIRE_BROWSER=1: there a missing browser fails instead of skipping."""
    return os.environ.get("HOOKSCOPE_REQUIRE_BROWSER") == "1"


def _missing(what):
    if _required():
        pytest.fail(f"{what} is missing (HOOKSCOPE_REQUIRE_BROWSER=1)")
    pytest.skip(f"{what} is missing")


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("HOOKSCOPE_BIN") or str(ROOT / "target" / "debug" / "hookscope")
    if not os.path.exists(path):
        _missing(f"the hookscope binary ({path}; set HOOKSCOPE_BIN)")
    return path


def serve(binary, *arguments):
    """`hookscope serve` on the embedded model, its address read from its first line; yields
    the address and stops the server (which must exit 0)."""
    process = subprocess.Popen(
        [binary, "serve", "--addr", "127.0.0.1:0", *arguments],
        stderr=subprocess.PIPE,
        text=True,
    )
    line = process.stderr.readline()
    if "http://" not in line:
        process.kill()
        pytest.fail(f"hookscope serve did not start: {line}{process.stderr.read()}")
    yield "http://" + line.split("http://")[1].split("/")[0]
    process.terminate()
    assert process.wait(timeout=30) == 0


@pytest.fixture(scope="session")
def server(binary):
    yield from serve(binary)


@pytest.fixture(scope="session")
def server_with_sae(binary, tmp_path_factory):
    """The server with a random SAELens SAE (32 features) on `layers.1.layer_output` of the
    embedded model (hidden size 64)."""
    import numpy as np
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("sae")
    generator = np.random.default_rng(7)
    hidden, width = 64, 32
    save_file({
        "W_enc": generator.normal(0, 0.3, (hidden, width)).astype(np.float32),
        "b_enc": generator.normal(0, 0.1, (width,)).astype(np.float32),
        "W_dec": generator.normal(0, 0.3, (width, hidden)).astype(np.float32),
        "b_dec": generator.normal(0, 0.1, (hidden,)).astype(np.float32),
    }, str(folder / "sae_weights.safetensors"))
    (folder / "cfg.json").write_text(json.dumps({
        "architecture": "standard", "d_in": hidden, "d_sae": width, "dtype": "float32",
        "apply_b_dec_to_input": True, "normalize_activations": "none",
        "metadata": {"hook_name": "blocks.1.hook_resid_post"},
    }))
    yield from serve(binary, "--sae", str(folder))


@pytest.fixture(scope="session")
def browser():
    try:
        from selenium import webdriver
    except ImportError:
        _missing("selenium (pip install selenium)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        _missing("chromium and chromium-driver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1400,2000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path),
                              options=options)
    driver.set_script_timeout(120)
    yield driver
    driver.quit()
