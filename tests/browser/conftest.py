"""The browser tests run only when asked: ``MINIVLLM_BROWSER=1 python -m pytest tests/browser``.

They need Debian's ``chromium`` (``apt-get install chromium``) and ``pip install playwright``
(its own browser is never downloaded: the system's is launched), and take minutes.
"""

from __future__ import annotations

import os

import pytest

BROWSER_ENV = "MINIVLLM_BROWSER"


def pytest_configure(config):
    config.addinivalue_line("markers", "browser: drives JupyterLab in a real browser (MINIVLLM_BROWSER=1)")


def pytest_collection_modifyitems(config, items):
    asked = os.environ.get(BROWSER_ENV, "").strip().lower() not in ("", "0", "false", "no")
    for item in items:
        if "browser" not in item.keywords:
            continue
        if not asked:
            item.add_marker(pytest.mark.skip(reason=f"a browser test: set {BROWSER_ENV}=1 to run it"))
