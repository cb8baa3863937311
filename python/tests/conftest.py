"""Shared fixtures: unique namespaces, a Go owner process (the capi test binary re-executed in
its owner role, found in $SHMSTEER_GO_OWNER_BIN), a spawn multiprocessing context."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import uuid

import pytest

GO_OWNER_ENV = "SHMSTEER_GO_OWNER_BIN"


@pytest.fixture
def ns() -> str:
    return "pytest-" + uuid.uuid4().hex


@pytest.fixture
def secret() -> bytes:
    return uuid.uuid4().hex.encode()


@pytest.fixture
def spawn():
    return multiprocessing.get_context("spawn")


@pytest.fixture
def go_owner(ns, secret):
    """A Go owner serving the fixture of capi_test.go: key "req-1" = bytes 0..31,
    "req-1-revoked" revoked, vector "v1" (post_block, layer 1, data i*0.25, hidden 64)."""
    binary = os.environ.get(GO_OWNER_ENV)
    if not binary:
        pytest.skip(f"{GO_OWNER_ENV} not set: run through `go test ./capi -run TestPython`, which sets it")
    env = dict(os.environ, SHMSTEER_CAPI_ROLE="owner", SHMSTEER_TEST_NS=ns, SHMSTEER_SECRET=secret.decode())
    proc = subprocess.Popen([binary], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    line = proc.stdout.readline()
    assert line == b"ready\n", line
    yield proc
    proc.stdin.close()
    proc.wait(timeout=10)
