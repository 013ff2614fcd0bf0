"""Several metadata services over one PostgreSQL store serve one namespace."""

from __future__ import annotations

import os

from tectofs.client import connect

MiB = 1 << 20


def test_two_metadata_services_share_one_postgres_namespace(make_cluster, postgres_server):
    from tectofs.testing.postgres import new_database

    c = make_cluster(store=new_database(postgres_server))
    address_b, process_b = c.start_extra_meta()
    try:
        with connect(c.address) as a, connect(address_b, credentials=c.credential_file) as b:
            data = os.urandom(3 * MiB + 11)
            a.mkdir("/shared")
            a.write_bytes("/shared/from-a", data)
            assert b.read_bytes("/shared/from-a") == data  # layout from the other MDS
            b.write_bytes("/shared/from-b", data[::-1])
            b.rename("/shared/from-b", "/shared/from-a")  # atomic replace through MDS b
            assert a.read_bytes("/shared/from-a") == data[::-1]
            assert sorted(a.listdir("/shared")) == ["from-a"]
            assert {s.server_id for s in a.servers() if s.live} == {s.server_id for s in b.servers() if s.live}
    finally:
        process_b.terminate()
        process_b.wait(timeout=20)


def test_concurrent_creates_through_two_services_all_land(make_cluster, postgres_server):
    import threading

    from tectofs.testing.postgres import new_database

    c = make_cluster(store=new_database(postgres_server))
    address_b, process_b = c.start_extra_meta()
    failures: list[BaseException] = []

    def create(address: str, prefix: str) -> None:
        try:
            with connect(address, credentials=c.credential_file) as fs:
                for i in range(60):
                    fs.write_bytes(f"/busy/{prefix}-{i}", b"x")
                    fs.mkdir(f"/busy/{prefix}-dir-{i}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    try:
        c.fs.mkdir("/busy")
        threads = [threading.Thread(target=create, args=(addr, f"{n}"))
                   for n, addr in enumerate([c.address, address_b, c.address, address_b])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not failures, failures
        assert len(c.fs.listdir("/busy")) == 4 * 60 * 2
        assert c.fs.stat("/busy").nlink == 2 + 4 * 60  # directory link counts stayed exact
    finally:
        process_b.terminate()
        process_b.wait(timeout=20)
