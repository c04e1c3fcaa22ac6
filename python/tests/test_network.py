"""Network changes through the SDK on a node with sandbox networking (its own bridge, subnet,
nftables table and BPF pin directory, all removed at the end): create with ``network``, read it,
change it live, and the errors of bad changes."""

from __future__ import annotations

import os
import random
import shutil
import subprocess

import pytest

import warren
from conftest import start_server


def test_network_create_get_patch() -> None:
    if os.geteuid() != 0:
        pytest.skip("sandbox networking needs root")
    tag = f"{os.getpid() % 46656:x}{random.randrange(1296):x}"
    bridge, table = f"wpy{tag}"[:15], f"wpy{tag}"
    subnet = f"10.{150 + os.getpid() % 50}.{random.randrange(250)}.0/24"
    node = start_server("n", ["--bridge", bridge, "--subnet", subnet, "--nft-table", table, "--netns-warm", "1", "--dns-upstream", "127.0.0.1:9"])
    try:
        with node.client() as c:
            feats = c.features()["features"]
            missing = [f"{k}: {feats.get(k, {}).get('reason', 'not reported')}" for k in ("egress-bpf", "sandbox-network") if not feats.get(k, {}).get("supported")]
            if missing:
                pytest.skip("sandbox networking unavailable on this kernel: " + "; ".join(missing))
            with c.create_sandbox(image="default", network={"pypi": True, "npm": False}) as sb:
                assert sb.info is not None and sb.info["network"]["services"] == {"pypi": True, "npm": False}
                info = sb.network()
                assert info["services"] == {"pypi": True, "npm": False} and info["address"]
                changed = sb.set_network({"npm": True, "pypi": False})
                assert changed["services"] == {"pypi": False, "npm": True}
                assert sb.network()["services"] == {"pypi": False, "npm": True}
                with pytest.raises(warren.BadInputError) as e:
                    sb.set_network({"no-such-service": True})
                assert e.value.code == "INVALID_ARGUMENT"
            with c.create_sandbox(image="default", network={}) as closed:
                assert closed.network()["services"] == {}
                assert closed.set_network({"pypi": True})["services"] == {"pypi": True}
            with c.create_sandbox(image="default") as plain:
                with pytest.raises(warren.NotSupportedError):
                    plain.network()
    finally:
        leftovers = node.cleanup()
        # node-wide network state outlives a stopped node (sandboxes may still use it); this
        # node's bridge, table and pins are ours alone
        subprocess.run(["nft", "delete", "table", "inet", table], check=False, stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "link", "delete", "dev", bridge, "type", "bridge"], check=False, stderr=subprocess.DEVNULL)
        shutil.rmtree(f"/sys/fs/bpf/warren/{node.node_id}", ignore_errors=True)
    assert leftovers == []
    assert not os.path.exists(f"/sys/class/net/{bridge}")
