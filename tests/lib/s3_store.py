"""A real S3-compatible object store on loopback for the `--upload` tests, and real clients for it.

The server is moto's in server mode (`moto_server`, a Flask app speaking the S3 REST API over
HTTP); the upload command is the real `aws` CLI (`aws s3 cp`), configured only through its own
environment variables and config file: credentials that moto accepts, the region, no instance
metadata look-ups, and optionally its `max_bandwidth` setting to slow an upload on purpose. The
tests read the store back with boto3.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from esiwrap_harness import free_port

BIN = Path(sys.executable).parent
AWS = str(BIN / "aws")
MOTO_SERVER = str(BIN / "moto_server")
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask 169.254.169.254 for a region or credentials
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


class S3Store:
    """`moto_server` on 127.0.0.1:PORT, until `close`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "moto.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([MOTO_SERVER, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **CREDENTIALS})
        deadline = time.monotonic() + 60
        while not self._answers():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"moto_server did not start: {(workdir / 'moto.log').read_text()}")
            time.sleep(0.2)  # polling a server that is starting: the answer is the event

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/", timeout=2):
                return True
        except OSError:
            return False

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def keys(self, bucket: str) -> list[str]:
        listing = self.client().list_objects_v2(Bucket=bucket)
        return sorted(item["Key"] for item in listing.get("Contents", []))

    def read(self, bucket: str, key: str) -> bytes:
        body: bytes = self.client().get_object(Bucket=bucket, Key=key)["Body"].read()
        return body

    def env(self, name: str, max_bandwidth: str | None = None) -> dict[str, str]:
        """The aws CLI's environment: credentials, and its own config file (`max_bandwidth` in
        bytes a second, e.g. '1MB/s', slows `aws s3` transfers the way the CLI does it)."""
        config = self.workdir / f"aws-config-{name}"
        lines = ["[default]", "region = us-east-1"]
        if max_bandwidth:
            lines += ["s3 =", f"  max_bandwidth = {max_bandwidth}"]
        config.write_text("\n".join(lines) + "\n")
        return {**CREDENTIALS, "AWS_CONFIG_FILE": str(config)}

    def upload_command(self, bucket: str, key: str = "job/{step}/latest.pt") -> str:
        """`aws s3 cp {path} s3://BUCKET/KEY`, the shape of command a user gives --upload."""
        return f"{shlex.quote(AWS)} --endpoint-url {self.url} s3 cp --only-show-errors {{path}} s3://{bucket}/{key}"

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 9)
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=10)
        self.log.close()


@contextlib.contextmanager
def store_with_bucket(workdir: Path, bucket: str) -> Iterator[S3Store]:
    """A running store with `bucket` in it, closed afterwards (a test module's fixture)."""
    s3 = S3Store(workdir)
    try:
        s3.create_bucket(bucket)
        yield s3
    finally:
        s3.close()
