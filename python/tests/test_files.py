"""Files: read, write, list, tar upload and download (sync and asyncio)."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import tempfile

import pytest

import warren
from conftest import WarrenServer


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for name, data in files.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            ti.mode = 0o644
            tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def test_files_sync(client: warren.Client) -> None:
    with client.create_sandbox(image="default") as sb:
        blob = bytes(range(256)) * 4096  # 1 MiB, every byte value
        sb.write_file("/work/deep/dir/blob.bin", blob, mode=0o640)
        assert sb.read_file("/work/deep/dir/blob.bin") == blob
        sb.write_file("/work/hello.txt", "héllo\n")
        assert sb.read_file("/work/hello.txt").decode() == "héllo\n"
        entries = {e["name"]: e for e in sb.list_dir("/work/deep/dir")}
        assert entries["blob.bin"]["type"] == "file" and entries["blob.bin"]["size"] == len(blob)
        assert entries["blob.bin"]["mode"] & 0o777 == 0o640
        assert {e["name"] for e in sb.list_dir("/work")} >= {"deep", "hello.txt"}
        with pytest.raises(warren.NotFoundError) as e:
            sb.read_file("/work/missing")
        assert e.value.code == "FILE_NOT_FOUND"

        up = sb.upload_tar("/srv/app", _tar({"a.txt": b"A", "sub/b.txt": b"B" * 10}))
        assert up["entries"] >= 2
        assert sb.exec("cat /srv/app/a.txt /srv/app/sub/b.txt").stdout == "A" + "B" * 10
        with pytest.raises(warren.BadInputError) as esc:
            sb.upload_tar("/srv/app", _tar({"../escape.txt": b"x"}))
        assert esc.value.code == "ARCHIVE_ESCAPE"
        assert sb.exec("test -e /srv/escape.txt").exit_code == 1

        data = sb.download_tar("/srv/app")
        with tarfile.open(fileobj=io.BytesIO(data)) as tf:
            members = {m.name.rstrip("/") for m in tf.getmembers()}
            assert any(n.endswith("sub/b.txt") for n in members)
            f = tf.extractfile(next(m for m in tf.getmembers() if m.name.endswith("a.txt")))
            assert f is not None and f.read() == b"A"
        out = io.BytesIO()
        n = sb.download_tar_to("/work/deep", out)
        assert n == len(out.getvalue()) and n > len(blob)

        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "pkg"))
            with open(os.path.join(d, "pkg", "m.py"), "w") as fh:
                fh.write("print('from upload_dir')\n")
            sb.upload_dir(d, "/opt/code")
        assert sb.exec(["cat", "/opt/code/pkg/m.py"]).stdout == "print('from upload_dir')\n"


def test_files_async(server: WarrenServer) -> None:
    async def main() -> None:
        async with server.aclient() as c:
            async with await c.create_sandbox(image="default") as sb:
                await sb.write_file("/tmp/a", b"\x00\x01binary")
                assert await sb.read_file("/tmp/a") == b"\x00\x01binary"
                assert [e["name"] for e in await sb.list_dir("/tmp")] == ["a"]
                await sb.upload_tar("/tmp/t", _tar({"x": b"1"}))
                assert (await sb.exec("cat /tmp/t/x")).stdout == "1"
                tar = await sb.download_tar("/tmp/t")
                with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
                    assert any(m.name.endswith("x") for m in tf.getmembers())
                out = io.BytesIO()
                assert await sb.download_tar_to("/tmp/t", out) == len(tar)

    asyncio.run(main())
