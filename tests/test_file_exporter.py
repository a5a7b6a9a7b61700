"""The file exporter: what the file holds for each format and signal, compression, flushing, and
rotation under a sustained stream."""

from __future__ import annotations

import datetime
import gzip
import json
import os
import shutil
import struct
import subprocess
import threading
import time

import pytest
import zstandard
from opentelemetry.proto.logs.v1 import logs_pb2

from pycollector.component import StartError
from pycollector.testing import TestHost, assert_conformance, make_settings, sample_data

from exporters.file.config import FileConfig
from exporters.file.factory import factory
from exporters.file.output_file import MEGABYTE

# Two producers of 300 messages of 20 kB: ~12 MB in all, so a 1 MB file rotates many times over.
MESSAGES_PER_PRODUCER = 300
SIGNAL_CLASSES = {signal: type(sample_data(signal)) for signal in ("traces", "metrics", "logs", "profiles")}


def started(**config):
    exporter = factory.create(make_settings("exporters", "file"), factory.config_model(**config), None)
    exporter.start(TestHost())
    return exporter


def proto_messages(content: bytes) -> list[bytes]:
    """Split a `proto` file: each message follows its length, 4 bytes big-endian."""
    messages, position = [], 0
    while position < len(content):
        (length,) = struct.unpack_from(">I", content, position)
        messages.append(content[position + 4:position + 4 + length])
        position += 4 + length
    return messages


def unzstd(content: bytes) -> bytes:
    """What any zstd reader gets from a file of frames back to back."""
    return zstandard.ZstdDecompressor().stream_reader(content, read_across_frames=True).read()


def big_log(size: int) -> logs_pb2.LogsData:
    message = sample_data("logs")
    message.resource_logs[0].scope_logs[0].log_records[0].body.string_value = "x" * size
    return message


def test_keeps_the_contract(tmp_path):
    assert_conformance(factory, "exporters", {"path": str(tmp_path / "out.jsonl")})


def test_json_is_one_otlp_json_message_per_line_for_every_signal(tmp_path):
    path = tmp_path / "out.jsonl"
    exporter = started(path=str(path))
    for signal in SIGNAL_CLASSES:
        exporter.consume(sample_data(signal))
    exporter.shutdown()
    documents = [json.loads(line) for line in path.read_text().splitlines()]
    assert [next(iter(document)) for document in documents] == ["resourceSpans", "resourceMetrics", "resourceLogs", "resourceProfiles"]
    span = documents[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert span["traceId"] == "01" * 16 and span["spanId"] == "02" * 8  # hex, as OTLP/JSON has it


def test_proto_is_length_prefixed_messages_for_every_signal(tmp_path):
    path = tmp_path / "out.bin"
    exporter = started(path=str(path), format="proto")
    sent = [sample_data(signal) for signal in SIGNAL_CLASSES]
    for message in sent:
        exporter.consume(message)
    exporter.shutdown()
    decoded = [message_class.FromString(raw) for message_class, raw in zip(SIGNAL_CLASSES.values(), proto_messages(path.read_bytes()))]
    assert decoded == sent


def test_gzip_files_read_whole_with_any_gzip_reader_even_while_written(tmp_path):
    path = tmp_path / "out.jsonl.gz"
    exporter = started(path=str(path), compression="gzip", flush_interval="50ms")
    exporter.consume(sample_data("logs"))
    time.sleep(0.3)  # flushed by the timer: a complete gzip member already
    assert len(gzip.decompress(path.read_bytes()).splitlines()) == 1
    exporter.consume(sample_data("logs"))
    exporter.shutdown()
    assert len(gzip.decompress(path.read_bytes()).splitlines()) == 2


def test_zstd_files_hold_the_messages_sent_and_the_zstd_tool_reads_them(tmp_path):
    path = tmp_path / "out.bin.zst"
    exporter = started(path=str(path), format="proto", compression="zstd", flush_interval="50ms")
    sent = [sample_data(signal) for signal in SIGNAL_CLASSES]
    exporter.consume(sent[0])
    time.sleep(0.3)  # flushed by the timer: one frame, then the rest in another
    for message in sent[1:]:
        exporter.consume(message)
    exporter.shutdown()
    assert zstandard.get_frame_parameters(path.read_bytes())  # a zstd file, not plain protobuf
    contents = [unzstd(path.read_bytes())]
    if shutil.which("zstd"):  # the command line tool, where the machine has it
        contents.append(subprocess.run(["zstd", "-dc", str(path)], check=True, capture_output=True).stdout)
    for content in contents:
        decoded = [message_class.FromString(raw) for message_class, raw in zip(SIGNAL_CLASSES.values(), proto_messages(content))]
        assert decoded == sent


def test_held_messages_reach_the_file_every_flush_interval(tmp_path):
    path = tmp_path / "out.jsonl"
    exporter = started(path=str(path), flush_interval="100ms")
    exporter.consume(sample_data("traces"))
    assert path.read_bytes() == b""
    deadline = time.monotonic() + 5
    while not path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert path.read_bytes().count(b"\n") == 1
    exporter.shutdown()


def test_truncates_unless_appending(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    started(path=str(path), append=True).shutdown()
    assert path.read_text() == "old\n"
    started(path=str(path)).shutdown()
    assert path.read_text() == ""


def test_rotation_keeps_size_and_backup_limits_under_a_sustained_stream(tmp_path):
    path = tmp_path / "stream.json"
    exporter = started(path=str(path), rotation={"max_megabytes": 1, "max_backups": 2}, flush_interval="20ms")
    message = big_log(20_000)

    def produce():
        for _ in range(MESSAGES_PER_PRODUCER):
            exporter.consume(message)

    producers = [threading.Thread(target=produce) for _ in range(2)]
    for producer in producers:
        producer.start()
    for producer in producers:
        producer.join()
    exporter.shutdown()

    files = sorted(tmp_path.iterdir())
    assert len(files) == 3, [f.name for f in files]  # stream.json and the two newest backups
    assert all(f.stat().st_size <= MEGABYTE for f in files), {f.name: f.stat().st_size for f in files}
    lines = [line for f in files for line in f.read_bytes().splitlines()]
    assert all(json.loads(line)["resourceLogs"] for line in lines)  # no message split by a rotation
    assert len(lines) < 2 * MESSAGES_PER_PRODUCER
    backups = [f for f in files if f.name != "stream.json"]
    assert all(f.name.startswith("stream-") and f.name.endswith(".json") for f in backups)
    # A file is rotated only when the next write (at most a quarter of the limit) would not fit,
    # so a backup is never rotated away half empty. (The current file may hold anything.)
    assert all(f.stat().st_size > 0.7 * MEGABYTE for f in backups), {f.name: f.stat().st_size for f in backups}


def test_rotation_with_zstd_leaves_every_file_whole_frames(tmp_path):
    path = tmp_path / "stream.json.zst"
    exporter = started(path=str(path), rotation={"max_megabytes": 1, "max_backups": 0}, compression="zstd")
    # Random text, so that even compressed the stream fills a megabyte several times over.
    bodies = [os.urandom(10_000).hex() for _ in range(MESSAGES_PER_PRODUCER)]
    for body in bodies:
        message = sample_data("logs")
        message.resource_logs[0].scope_logs[0].log_records[0].body.string_value = body
        exporter.consume(message)
    exporter.shutdown()

    files = sorted(tmp_path.iterdir())  # oldest backup first ('-' sorts before '.'), stream.json.zst last
    assert len(files) > 3 and all(f.stat().st_size <= MEGABYTE for f in files), {f.name: f.stat().st_size for f in files}
    lines = [line for f in files for line in unzstd(f.read_bytes()).splitlines()]
    assert [json.loads(line)["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0]["body"]["stringValue"] for line in lines] == bodies


def test_rotation_deletes_backups_older_than_max_days_at_start(tmp_path):
    path = tmp_path / "data.json"
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=10)
    recent = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=1)
    for moment in (old, recent):
        (tmp_path / f"data-{moment.strftime('%Y-%m-%dT%H-%M-%S')}.000.json").write_text("{}\n")
    (tmp_path / "data-notes.json").write_text("not a backup")
    started(path=str(path), rotation={"max_days": 3}).shutdown()
    assert sorted(f.name for f in tmp_path.iterdir()) == sorted(["data.json", "data-notes.json", f"data-{recent.strftime('%Y-%m-%dT%H-%M-%S')}.000.json"])


def test_rotation_key_alone_turns_rotation_on_with_the_defaults():
    config = factory.config_model.model_validate({"rotation": None})
    assert (config.rotation.max_megabytes, config.rotation.max_backups) == (100, 100)
    assert factory.config_model.model_validate({}).rotation is None


@pytest.mark.parametrize("config, message", [
    ({"append": True, "compression": "gzip"}, "append and compression"),
    ({"append": True, "rotation": {}}, "append and rotation"),
    ({"append": True, "compression": "zstd"}, "append and compression"),
    ({"compression": "lz4"}, "compression"),
])
def test_invalid_combinations_are_refused(config, message):
    with pytest.raises(ValueError, match=message):
        factory.config_model.model_validate(config)


def test_a_path_that_cannot_be_opened_fails_the_start(tmp_path):
    with pytest.raises(StartError, match="path: cannot open"):
        started(path=str(tmp_path / "missing" / "out.jsonl"))
    started(path=str(tmp_path / "made" / "out.jsonl"), create_directory=True).shutdown()
    assert (tmp_path / "made" / "out.jsonl").exists()


def test_create_directory_makes_it_with_the_permissions_given(tmp_path):
    import stat

    path = tmp_path / "made" / "profiles.json"
    old_mask = os.umask(0)
    try:
        exporter = started(path=str(path), create_directory=True, directory_permissions="0750")
        exporter.shutdown()
    finally:
        os.umask(old_mask)
    assert stat.S_IMODE((tmp_path / "made").stat().st_mode) == 0o750
    with pytest.raises(Exception, match="only used with create_directory"):
        FileConfig.model_validate({"path": str(path), "directory_permissions": "0750"})
    with pytest.raises(Exception, match="octal permission bits within 0777"):
        FileConfig.model_validate({"path": str(path), "create_directory": True, "directory_permissions": "4755"})
    assert FileConfig.model_validate({"path": str(path), "rotation": {"max_megabytes": 0}}).rotation.max_megabytes == 100  # (Go's 0)
