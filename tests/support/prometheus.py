"""Debian's Prometheus (and promtool) for the tests: scripts/setup-prometheus.sh installs
both; :class:`Prometheus` runs one on a free loopback port with its own TSDB."""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from jitserve.devstack import vllm as vl


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/setup-prometheus.sh")
    return path



class Prometheus:
    """Debian's prometheus on a free loopback port, with its own TSDB directory."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.port = vl.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("ab")
        self.proc = vl.start_process(
            [
                tool("prometheus"),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            self._log,
        )
        if not vl.wait_http_ok(self.url + "/-/ready", 60, self.proc):
            self.close()
            raise AssertionError(f"prometheus not ready:\n{vl.tail(self.log_path)}")

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            doc = json.loads(resp.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def close(self) -> None:
        vl.stop_process(self.proc)
        self._log.close()
