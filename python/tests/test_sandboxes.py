"""Sandboxes through the sync client: create with every field, get, list, exec, lifecycle,
pack and environments, errors with their stable codes, token discovery."""

from __future__ import annotations

import os
import uuid

import pytest

import warren
from conftest import WarrenServer, free_port, processes_with, wait_for


def test_health_features_whoami(client: warren.Client) -> None:
    h = client.health()
    assert h["status"] == "ok" and h["node"]
    f = client.features()
    assert "features" in f and "backends" in f
    assert f["backends"]["container"]["available"] is True
    assert isinstance(f["enforcer"], str)
    me = client.whoami()
    assert me["role"] == "admin"


def test_create_with_every_field(client: warren.Client) -> None:
    tag = uuid.uuid4().hex[:8]
    with client.create_sandbox(
        image="default",
        backend="container",
        workspaces=[],
        toolkits=[],
        cpu=0.5,
        memory_mb=256,
        pids=128,
        disk_mb=64,
        ttl_seconds=600,
        idle_seconds=300,
        on_idle="pause",
        priority="idle",
        user="root",
        env={"GREETING": "hello"},
        labels={"suite": "py", "run": tag},
    ) as sb:
        info = sb.info
        assert info is not None and info["state"] == "running"
        assert info["limits"] == {"cpu": 0.5, "memoryMb": 256, "pids": 128, "diskMb": 64}
        assert info["priority"] == "idle"
        assert info["labels"] == {"suite": "py", "run": tag}
        assert info["lifecycle"]["idleSeconds"] == 300 and info["lifecycle"]["onIdle"] == "pause"
        assert info["lifecycle"]["expiresAt"] is not None
        r = sb.exec("echo $GREETING; id -u")
        assert r.stdout == "hello\n0\n" and r.exit_code == 0 and r.ok
        # get and list see the same sandbox
        again = client.get_sandbox(sb.id)
        assert again.id == sb.id and again.state == "running"
        listed = client.list_sandboxes(labels={"run": tag})
        assert [s["id"] for s in listed] == [sb.id]
        assert client.list_sandboxes(labels={"run": "nope-" + tag}) == []
        assert sb.refresh()["id"] == sb.id
        ext = sb.extend(seconds=60)
        assert ext["lifecycle"]["expiresAt"] > info["lifecycle"]["expiresAt"]
        with pytest.raises(warren.BadInputError):
            sb.extend()
    with pytest.raises(warren.NotFoundError) as e:
        client.get_sandbox(sb.id)
    assert e.value.code == "SANDBOX_NOT_FOUND" and e.value.status == 404


def test_network_field_on_a_node_without_networking(client: warren.Client) -> None:
    # This node runs with --no-network: the server's refusal arrives as NotSupportedError.
    with pytest.raises(warren.NotSupportedError) as e:
        client.create_sandbox(image="default", network={"pypi": True})
    assert e.value.code == "NOT_SUPPORTED"
    assert client.list_sandboxes() == [] or all(s["image"] for s in client.list_sandboxes())


def test_exec(client: warren.Client) -> None:
    with client.create_sandbox(image="default", memory_mb=256) as sb:
        r = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 7"])
        assert (r.exit_code, r.stdout, r.stderr, r.status) == (7, "out\n", "err\n", "error")
        assert not r.ok
        r = sb.exec("cat; pwd; echo $K", stdin="in\n", env={"K": "v"}, cwd="/tmp")
        assert r.stdout == "in\n/tmp\nv\n"
        r = sb.exec(["id", "-un"], user="nobody", cwd="/")
        assert r.stdout.strip() == "nobody"
        r = sb.exec("sleep 30", timeout=0.3)
        assert r.status == "timeout" and r.exit_code is None
        r = sb.exec("head -c 100000 /dev/zero | tr '\\0' x", max_output_bytes=1000)
        assert r.truncated and len(r.stdout) == 1000


def test_exec_stream(client: warren.Client) -> None:
    chunks: list[warren.ShellOutput] = []
    with client.create_sandbox(image="default") as sb:
        r = sb.exec_stream("for i in 1 2 3; do echo line$i; sleep 0.05; done; echo bad >&2; exit 4", chunks.append, cwd="/tmp", env={"A": "b"})
        assert r.exit_code == 4 and r.stdout == "line1\nline2\nline3\n" and r.stderr == "bad\n"
        assert len([c for c in chunks if c.stream == "stdout"]) >= 2, "output arrives in pieces as it is produced"
        assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"line1\nline2\nline3\n"
        assert sb.sessions() == [] or all(not s["alive"] for s in sb.sessions()), "the streaming session is closed"


def test_pause_resume_hibernate(client: warren.Client) -> None:
    with client.create_sandbox(image="default", labels={"job": "py-pause"}) as sb:
        p = sb.pause()
        assert p["state"] == "paused" and p["changed"] is True
        assert client.get_sandbox(sb.id).state == "paused"
        r = sb.resume()
        assert r["state"] == "running" and r["changed"] is True
        many = client.pause_sandboxes({"job": "py-pause"})
        assert [x["id"] for x in many] == [sb.id]
        # any request resumes a paused sandbox transparently
        assert sb.exec("echo ok").stdout == "ok\n"
        assert [x["id"] for x in client.resume_sandboxes({"job": "py-pause"})] == [sb.id]
        with pytest.raises(warren.BadInputError):
            client.pause_sandboxes({})
        try:
            h = sb.hibernate()
            assert h["state"] == "hibernated"
        except warren.NotSupportedError as e:  # CRIU is missing or cannot run here: the reason is reported
            assert e.code == "NOT_SUPPORTED" and e.message


def test_pack_and_environments(client: warren.Client) -> None:
    name = f"pyenv-{uuid.uuid4().hex[:6]}:v1"
    with client.create_sandbox(image="default") as sb:
        sb.write_file("/srv/answer.txt", "42\n")
        sb.write_file("/srv/secret.key", "k")
        res = sb.pack(name, scrub=["/srv/*.key"], publish=False)
        assert res["environment"]["name"] == name and res["environment"]["published"] is False
        assert any(s.endswith("secret.key") for s in res["scrubbed"])
    envs = {e["name"]: e for e in client.list_environments()}
    assert name in envs
    assert client.publish_environment(name)["published"] is True
    assert client.publish_environment(name, published=False)["published"] is False
    with client.create_sandbox(image=name) as child:
        assert child.read_file("/srv/answer.txt") == b"42\n"
        with pytest.raises(warren.NotFoundError) as e:
            child.read_file("/srv/secret.key")
        assert e.value.code == "FILE_NOT_FOUND"


def test_images(client: warren.Client) -> None:
    names = {i["name"] for i in client.images.list()}
    assert "default" in names


def test_image_delete(client: warren.Client, tmp_path: "os.PathLike[str]") -> None:
    root = os.path.join(tmp_path, "rootfs")
    os.makedirs(os.path.join(root, "etc"))
    with open(os.path.join(root, "etc", "only-here"), "w") as f:
        f.write(uuid.uuid4().hex)
    img = client.images.import_image("py-delete-me", root)
    assert any(i["name"] == "py-delete-me" for i in client.images.list())
    removed = client.images.delete("py-delete-me")
    assert removed["name"] == "py-delete-me"
    assert removed["removedLayers"] == img["layers"], "its own layer, used by no other image, went with it"
    assert not any(i["name"] == "py-delete-me" for i in client.images.list())
    with pytest.raises(warren.NotFoundError) as e:
        client.images.delete("py-delete-me")
    assert e.value.code == "IMAGE_NOT_FOUND"
    with pytest.raises(warren.BadInputError) as bad:
        client.images.delete("Not A Name")
    assert bad.value.code == "INVALID_ID"


def test_context_manager_deletes_on_exception(client: warren.Client) -> None:
    marker = f"{uuid.uuid4().int % 10000}.25"
    ids = []
    with pytest.raises(RuntimeError):
        with client.create_sandbox(image="default") as sb:
            ids.append(sb.id)
            sb.exec(f"sleep {marker} >/dev/null 2>&1 &")
            assert wait_for(lambda: processes_with(f"sleep\0{marker}") != [])
            raise RuntimeError("boom")
    with pytest.raises(warren.NotFoundError):
        client.get_sandbox(ids[0])
    assert wait_for(lambda: processes_with(f"sleep\0{marker}") == []), "the sandbox's processes are gone"


def test_bad_input_is_caught_before_a_request() -> None:
    # Nothing listens here: a request would be UnavailableError, so BadInputError proves none was made.
    c = warren.Client(f"http://127.0.0.1:{free_port()}", "wrn_x", retries=0)
    try:
        cases = [
            (lambda: c.create_sandbox(memory_mb=1), "LIMIT_OUT_OF_RANGE"),
            (lambda: c.create_sandbox(memory_mb=256.5), "INVALID_ARGUMENT"),  # type: ignore[arg-type]
            (lambda: c.create_sandbox(cpu=float("nan")), "LIMIT_OUT_OF_RANGE"),
            (lambda: c.create_sandbox(on_idle="stop"), "INVALID_ARGUMENT"),
            (lambda: c.create_sandbox(env={"1BAD": "x"}), "INVALID_ARGUMENT"),
            (lambda: c.create_sandbox(network={"pypi": "yes"}), "INVALID_ARGUMENT"),  # type: ignore[dict-item]
            (lambda: c.create_sandbox(image="../etc"), "INVALID_ID"),
            (lambda: c.get_sandbox("Bad/Id"), "INVALID_ID"),
            (lambda: c.sandbox("abc").read_file("relative/path"), "PATH_ESCAPE"),
            (lambda: c.sandbox("abc").read_file("/a/../b"), "PATH_ESCAPE"),
            (lambda: c.sandbox("abc").exec([]), "INVALID_ARGUMENT"),
            (lambda: c.sandbox("abc").exec("true", timeout=7200), "LIMIT_OUT_OF_RANGE"),
            (lambda: c.functions.invoke("py"), "INVALID_ARGUMENT"),
            (lambda: c.functions.invoke("py", "print(1)"), "INVALID_ARGUMENT"),
            (lambda: c.functions.invoke("Bad Pool", cmd="true"), "INVALID_ID"),
            (lambda: c.functions.batch("py", [{"code": "1", "language": "python3", "bogus": 1}]), "UNKNOWN_FIELD"),
        ]
        for fn, code in cases:
            with pytest.raises(warren.BadInputError) as e:
                fn()
            assert e.value.code == code, (e.value, code)
        with pytest.raises(warren.UnavailableError):
            c.health()
    finally:
        c.close()


def test_server_errors_are_reported_faithfully(client: warren.Client, server: WarrenServer) -> None:
    with pytest.raises(warren.BadInputError) as e:
        client.create_sandbox(cpu=100000)
    assert e.value.code == "LIMIT_OUT_OF_RANGE" and e.value.details.get("field") == "cpu"
    with pytest.raises(warren.NotFoundError) as nf:
        client.create_sandbox(image="no-such-image")
    assert nf.value.code == "IMAGE_NOT_FOUND"
    with pytest.raises(warren.NotFoundError) as sb:
        client.sandbox("no-such-sandbox").exec("true")
    assert sb.value.code == "SANDBOX_NOT_FOUND"
    with warren.Client(server.url, "wrn_not_a_token") as bad:
        with pytest.raises(warren.AuthError) as a:
            bad.list_sandboxes()
        assert a.value.code == "UNAUTHENTICATED" and a.value.status == 401
    # a runtime account may not pack or see other accounts
    acct = client.create_account(f"py-rt-{uuid.uuid4().hex[:6]}", "runtime")
    assert acct["token"].startswith("wrn_")
    assert acct["id"] in {a["id"] for a in client.list_accounts()}
    with warren.Client(server.url, acct["token"]) as rt:
        assert rt.whoami()["role"] == "runtime"
        with pytest.raises(warren.AuthError) as f:
            rt.list_accounts()
        assert f.value.code == "FORBIDDEN"
        client.set_quota(acct["id"], max_sandboxes=0)
        assert rt.quota()["quota"]["maxSandboxes"] == 0
        with pytest.raises(warren.QuotaExceededError) as q:
            rt.create_sandbox(image="default")
        assert q.value.code == "QUOTA_EXCEEDED" and isinstance(q.value, warren.ResourceExhaustedError)


def test_token_discovery(server: WarrenServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WARREN_TOKEN", raising=False)
    monkeypatch.delenv("WARREN_DATA_DIR", raising=False)
    with warren.Client(server.url, data_dir=server.data_dir) as c:
        assert c.whoami()["role"] == "admin"
    monkeypatch.setenv("WARREN_DATA_DIR", server.data_dir)
    monkeypatch.setenv("WARREN_URL", server.url)
    with warren.Client() as c:
        assert c.url == server.url and c.whoami()["role"] == "admin"
    monkeypatch.setenv("WARREN_TOKEN", server.token)
    monkeypatch.setenv("WARREN_DATA_DIR", "/nonexistent")
    with warren.Client() as c:
        assert c.token == server.token
    # an explicitly named data dir without a token is an error (the CLI does the same)
    monkeypatch.delenv("WARREN_TOKEN")
    with pytest.raises(warren.AuthError) as e:
        warren.Client(server.url, data_dir=os.path.join(server.data_dir, "missing"))
    assert e.value.code == "UNAUTHENTICATED"
