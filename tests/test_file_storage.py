"""The file_storage extension and the persistent sending queue on it, with real SQLite files.

End to end: real pycollector processes (a gateway: otlp receiver -> otlp_http exporter with a
persistent queue) killed with SIGKILL or stopped with SIGTERM while the backend is down, then
started again with the backend up; and in-process, a backend down for longer than
max_elapsed_time, with and without the persistent queue.
"""

from __future__ import annotations

import collections
import os
import signal
import time
import urllib.request

import pytest

from extensions.file_storage.client import FileStorageClient, StorageError
from extensions.file_storage.config import FileStorageConfig
from extensions.file_storage.extension import FileStorageExtension
from pycollector.component import StartError
from pycollector.exporterhelper.persistent_queue import PersistentQueue
from pycollector.exporterhelper.sizer import Sizer
from pycollector.otlp.signals import OTLP_SIGNALS
from pycollector.pdata import iter_samples
from pycollector.testing import TestHost, make_settings

from tests.test_otlp_support import HttpBackend, a_profile, build_service, counter, free_port

REQUESTS = 100
SAMPLES = 3  # per request


def storage(tmp_path, **settings) -> FileStorageExtension:
    config = FileStorageConfig(directory=str(tmp_path / "storage"), **{"create_directory": True, **settings})
    extension = FileStorageExtension(make_settings("extensions", "file_storage"), config)
    extension.start(TestHost())
    return extension


# -- the store -----------------------------------------------------------------------------------


def test_what_a_client_writes_is_there_after_the_process_reopens_it(tmp_path):
    extension = storage(tmp_path)
    client = extension.get_client("exporter", "otlp_http/backend")
    client.batch(sets=[("queue/2", b"two"), ("queue/1", b"one"), ("other", b"x")])
    client.delete("other")
    extension.shutdown()
    path = tmp_path / "storage" / "exporter_otlp_http_backend_"
    assert path.exists()
    again = storage(tmp_path).get_client("exporter", "otlp_http/backend")
    assert list(again.items("queue/")) == [("queue/1", b"one"), ("queue/2", b"two")]
    assert again.get("other") is None and again.get("queue/1") == b"one"


def test_a_damaged_store_and_a_missing_directory_are_clear_errors(tmp_path):
    damaged = tmp_path / "damaged"
    damaged.write_bytes(b"this is not a database file, whatever its name says" * 100)
    with pytest.raises(StorageError, match=f"{damaged} is not a usable store"):
        FileStorageClient(str(damaged), timeout=1, fsync=False)
    missing = FileStorageExtension(make_settings("extensions", "file_storage"), FileStorageConfig(directory=str(tmp_path / "nowhere")))
    with pytest.raises(StartError, match="extensions::file_storage::directory: .*nowhere does not exist"):
        missing.start(TestHost())
    read_only = tmp_path / "read_only"
    read_only.mkdir(mode=0o500)
    if os.geteuid() != 0:  # root writes anywhere
        with pytest.raises(StartError, match="is not writable"):
            FileStorageExtension(make_settings("extensions", "file_storage"), FileStorageConfig(directory=str(read_only))).start(TestHost())


def test_the_persistent_queue_replays_in_order_and_forgets_what_was_sent(tmp_path):
    client = storage(tmp_path).get_client("exporter", "otlp_http")
    queue = PersistentQueue(client, 10, Sizer("requests"))
    for pid in range(5):
        assert queue.offer(a_profile(SAMPLES, pid=pid))
    first = queue.take()
    queue.done(first)
    second = queue.take()  # taken, never done: the process "died" sending it
    assert [view.resource["process.pid"] for view in iter_samples(second.data)][0] == 1
    replayed = PersistentQueue(client, 10, Sizer("requests"))
    assert replayed.replayed == 4
    pids = []
    while len(replayed):
        request = replayed.take()
        pids.append(next(iter_samples(request.data)).resource["process.pid"])
        replayed.done(request)
    assert pids == [1, 2, 3, 4]
    assert list(client.items("queue/")) == []


def test_a_stored_request_that_does_not_decode_is_kept_aside_not_retried(tmp_path):
    """A damaged record (a disk error, a file of another version) used to stop the consumer at
    take(), and every start after: now it is moved under quarantine/, told, and the rest flows."""
    client = storage(tmp_path).get_client("exporter", "otlp_http")
    queue = PersistentQueue(client, 10, Sizer("requests"))  # (sized without decoding at start)
    for pid in range(3):
        assert queue.offer(a_profile(SAMPLES, pid=pid))
    keys = [key for key, _ in client.items("queue/")]
    client.set(keys[0], b"opentelemetry.proto.profiles.v1development.ProfilesData\n\xff\xff\xff")  # not a message
    client.set(keys[2], b"no type name at all")
    told = []
    replayed = PersistentQueue(client, 10, Sizer("requests"), on_quarantine=lambda key, error: told.append(key))
    assert told == [keys[2]] and replayed.replayed == 2
    request = replayed.take()  # keys[0] first: it fails to decode here, and keys[1] comes instead
    assert next(iter_samples(request.data)).resource["process.pid"] == 1 and told == [keys[2], keys[0]]
    replayed.done(request)
    assert replayed.used() == 0 and replayed.quarantined == 2
    assert [key for key, _ in client.items("quarantine/")] == ["quarantine/" + key[len("queue/"):] for key in (keys[0], keys[2])]
    assert PersistentQueue(client, 10, Sizer("requests")).replayed == 0  # never tried again


def test_a_store_that_fails_a_delete_gives_the_room_back(tmp_path):
    """A failed delete (or compaction) used to leave its request's size counted for good."""
    client = storage(tmp_path).get_client("exporter", "otlp_http")
    queue = PersistentQueue(client, 2, Sizer("requests"))
    assert queue.offer(a_profile(SAMPLES, pid=1)) and queue.offer(a_profile(SAMPLES, pid=2))
    request = queue.take()
    client.close()  # every later use of the store fails
    with pytest.raises(StorageError):
        queue.done(request)
    assert queue.used() == 1


def test_a_queue_sized_in_bytes_refuses_what_does_not_fit(tmp_path):
    client = storage(tmp_path).get_client("exporter", "otlp_http")
    request = a_profile(SAMPLES)
    queue = PersistentQueue(client, 3 * request.ByteSize(), Sizer("bytes"))
    assert [queue.offer(request) for _ in range(4)] == [True, True, True, False]
    assert queue.used() == 3 * request.ByteSize()
    assert PersistentQueue(client, 1, Sizer("items")).used() == 3 * SAMPLES


# -- end to end ----------------------------------------------------------------------------------


def gateway_config(receiver_port: int, backend_port: int, metrics_port: int, directory, *, batch: bool = False) -> dict:
    return {
        "extensions": {"file_storage": {"directory": str(directory), "create_directory": True}},
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{receiver_port}"}}}},
        "processors": {"batch": {"timeout": "60s", "send_batch_size": 100_000}} if batch else {},
        "exporters": {"otlp_http": {
            "endpoint": f"http://127.0.0.1:{backend_port}",
            "retry_on_failure": {"initial_interval": "100ms", "max_interval": "500ms", "max_elapsed_time": 0},
            "sending_queue": {"storage": "file_storage", "queue_size": 10_000},
        }},
        "service": {
            "extensions": ["file_storage"],
            "telemetry": {"metrics": {"address": f"127.0.0.1:{metrics_port}"}},
            "pipelines": {"profiles": {"receivers": ["otlp"], "processors": ["batch"] if batch else [], "exporters": ["otlp_http"]}},
        },
    }


def post_profiles(port: int, pid: int) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{OTLP_SIGNALS['profiles'].http_path}", data=a_profile(SAMPLES, pid=pid).SerializeToString(),
                                     headers={"Content-Type": "application/x-protobuf"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status


def arrived(backend: HttpBackend) -> collections.Counter:
    """How many times each sent sample (pid, thread) reached the backend."""
    return collections.Counter((view.resource["process.pid"], view.attributes["thread.id"])
                               for data in backend.of("profiles") for view in iter_samples(data))


def wait_for_every_sample(backend: HttpBackend, timeout: float = 30) -> collections.Counter:
    deadline = time.monotonic() + timeout
    while len(seen := arrived(backend)) < REQUESTS * SAMPLES and time.monotonic() < deadline:
        time.sleep(0.1)
    return seen


def expected_samples() -> set:
    return {(pid, pid + index) for pid in range(1000, 1000 + REQUESTS) for index in range(SAMPLES)}


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM with a batch holding the data"])
def test_what_the_gateway_accepted_reaches_the_backend_after_a_restart(collectors, tmp_path, stop):
    receiver_port, backend_port, metrics_port = free_port(), free_port(), free_port()
    batch = stop.startswith("SIGTERM")
    config = gateway_config(receiver_port, backend_port, metrics_port, tmp_path / "queue", batch=batch)
    first = collectors("gateway-1", config)
    first.wait_listening(receiver_port)
    assert all(post_profiles(receiver_port, pid) == 200 for pid in range(1000, 1000 + REQUESTS))  # the backend is down
    if batch:  # the batch drains into the exporter, whose queue keeps it on disk
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=15) == 0
    else:
        first.process.kill()
        first.process.wait()
    with HttpBackend(port=backend_port) as backend:
        second = collectors("gateway-2", config)
        second.wait_listening(receiver_port)
        seen = wait_for_every_sample(backend)
        missing = expected_samples() - set(seen)
        duplicated = sum(count - 1 for count in seen.values())
        print(f"{stop}: {len(seen)} of {REQUESTS * SAMPLES} samples arrived, {duplicated} more than once")
        assert not missing, f"lost {len(missing)} samples:\n{second.log()}"
        assert "sending what the persistent queue held when the collector stopped" in second.log()


@pytest.mark.parametrize("persistent", [True, False])
def test_a_backend_down_past_max_elapsed_time(tmp_path, persistent):
    """With a persistent queue nothing is dropped: a request whose retries ran out goes back in
    the queue. Without one it is dropped, and counted."""
    backend_port = free_port()
    config = {
        "extensions": {"file_storage": {"directory": str(tmp_path / "queue"), "create_directory": True}},
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{free_port()}"}}}},
        "exporters": {"otlp_http": {
            "endpoint": f"http://127.0.0.1:{backend_port}",
            "retry_on_failure": {"initial_interval": "50ms", "max_interval": "100ms", "max_elapsed_time": "300ms"},
            "sending_queue": {"storage": "file_storage"} if persistent else {},
        }},
        "service": {"extensions": ["file_storage"], "pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["otlp_http"]}},
                    "telemetry": {"metrics": {"level": "basic", "address": "127.0.0.1:0"}}},
    }
    service = build_service(config)
    service.start()
    try:
        exporter = next(node.component for node in service.graph.nodes.values() if node.key.kind == "exporters")
        for pid in range(1000, 1010):
            exporter.consume(a_profile(SAMPLES, pid=pid))
        time.sleep(1.2)  # four times max_elapsed_time with no backend
        failed = counter(service, "otelcol_exporter_send_failed_profile_samples_total", {"exporter": "otlp_http"})
        with HttpBackend(port=backend_port) as backend:
            deadline = time.monotonic() + 10
            while len(arrived(backend)) < 10 * SAMPLES and persistent and time.monotonic() < deadline:
                time.sleep(0.05)
            if persistent:
                assert failed == 0
                assert len(arrived(backend)) == 10 * SAMPLES
            else:
                assert failed == 10 * SAMPLES
                time.sleep(0.3)
                assert not arrived(backend)
    finally:
        service.shutdown()


def test_a_queue_naming_no_storage_extension_stops_the_start_with_the_key(tmp_path):
    config = {
        "receivers": {"otlp": {"protocols": {"http": {"endpoint": f"127.0.0.1:{free_port()}"}}}},
        "exporters": {"otlp_http": {"endpoint": "http://127.0.0.1:9", "sending_queue": {"storage": "file_storage/missing"}}},
        "service": {"pipelines": {"profiles": {"receivers": ["otlp"], "exporters": ["otlp_http"]}}},
    }
    service = build_service(config)
    with pytest.raises(StartError, match="exporters::otlp_http::sending_queue::storage: no storage extension 'file_storage/missing' in service::extensions"):
        service.start()


def test_max_size_bounds_a_stores_file_and_recreate_sets_a_corrupt_one_aside(tmp_path):
    bounded = storage(tmp_path / "bounded", max_size=64 * 1024)
    client = bounded.get_client("exporter", "otlp_grpc")
    with pytest.raises(StorageError, match="full"):
        for index in range(100):
            client.set(f"k{index}", b"x" * 4096)
    bounded.shutdown()
    first = storage(tmp_path / "recreated")
    path = first.get_client("exporter", "otlp_grpc").path
    first.shutdown()
    with open(path, "wb") as damaged:
        damaged.write(b"this is not a database" * 100)
    with pytest.raises(StorageError):
        storage(tmp_path / "recreated").get_client("exporter", "otlp_grpc")
    recreating = storage(tmp_path / "recreated", recreate=True)
    client = recreating.get_client("exporter", "otlp_grpc")
    client.set("k", b"v")
    assert client.get("k") == b"v"
    assert [name for name in os.listdir(tmp_path / "recreated" / "storage") if name.endswith(".backup")]
    recreating.shutdown()
