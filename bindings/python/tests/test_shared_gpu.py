"""gtp.shared_gpu: the environment that makes processes real NCCL peers on one GPU, the same as
gtp-launch --share-gpu sets (docs/real-peers.md)."""
import os
import re
import subprocess
import sys

import pytest

from gtp import shared_gpu


def test_every_rank_gets_its_own_nccl_host_on_loopback():
    a, b = shared_gpu.environment(0, "job7"), shared_gpu.environment(1, "job7")
    assert a["NCCL_HOSTID"] != b["NCCL_HOSTID"]
    assert a["NCCL_HOSTID"] != shared_gpu.environment(0, "job8")["NCCL_HOSTID"]
    for env in (a, b):
        assert env["NCCL_SOCKET_IFNAME"] == "lo" and env["NCCL_IB_DISABLE"] == "1"
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["LOCAL_RANK"] == "0" and env["GTP_SHARED_GPU"] == "1"


@pytest.mark.parametrize("rank, launch_id", [(-1, "x"), (True, "x"), (1.0, "x"), (0, ""), (0, "a b"), (0, "a/b")])
def test_bad_rank_or_launch_id_is_refused_naming_it(rank, launch_id):
    with pytest.raises(ValueError, match="rank|launch_id"):
        shared_gpu.environment(rank, launch_id)


def test_device_index(monkeypatch):
    monkeypatch.setenv("GTP_SHARED_GPU", "1")
    assert shared_gpu.active() and shared_gpu.device_index(3, 1) == 0
    monkeypatch.delenv("GTP_SHARED_GPU")
    assert not shared_gpu.active() and shared_gpu.device_index(1, 2) == 1
    with pytest.raises(ValueError, match="rank 2 needs GPU 2 but 1 are visible"):
        shared_gpu.device_index(2, 1)


@pytest.mark.skipif(not os.environ.get("GTP_LAUNCH"), reason="GTP_LAUNCH (the gtp-launch binary) is not set")
def test_same_settings_as_gtp_launch_share_gpu():
    names = sorted(shared_gpu.environment(0, "x"))
    script = "import os; print(repr({k: os.environ.get(k) for k in %r}))" % names
    run = subprocess.run([os.environ["GTP_LAUNCH"], "-n", "2", "--share-gpu", "--", sys.executable, "-c", script],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    for rank in (0, 1):
        line = re.search(r"^\[%d\] (\{.*\})$" % rank, run.stdout, re.M)
        assert line, run.stdout
        seen = eval(line.group(1))  # noqa: S307 - our own repr of a dict of strings
        launch_id = re.fullmatch(r"gtp-shared-gpu-(.+)-rank%d" % rank, seen["NCCL_HOSTID"]).group(1)
        assert seen == shared_gpu.environment(rank, launch_id)
