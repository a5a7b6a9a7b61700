"""The fuzz targets of tests/fuzz in the suite: every corpus input replayed (the crashes found
stay fixed), each target fuzzed for a few seconds under atheris with a fixed seed, OTLP inputs
through a real receiver answered as the in-process decode says, and the profiles property under
hypothesis. ``make fuzz`` runs the targets for long."""

from __future__ import annotations

import dataclasses
import http.client
import random
import socket
import subprocess
import time

import grpc
import pytest

from pycollector.otlp import OTLP_SIGNALS
from pycollector.testing import CapturingConsumer, TestHost, make_settings
from receivers.otlp.factory import factory
from tests.fuzz import targets
from tests.fuzz.__main__ import INSTRUMENTED, NAMES, ROOT, SEEDS, Result, add_stats, child_env, command, dictionary_flags

# Inputs each short run makes: a few seconds each here, the same inputs on every run.
SHORT_RUNS = {"otlp_decode": 10_000, "config": 400, "profiles_append_split": 10_000, "profiles_merge_split": 125,
              "elf_file": 150, "eh_frame": 2_500, "gopclntab": 1_000, "perf_map": 500, "cpython_linetable": 5_000,
              "cpython_debug_offsets": 5_000}


def _corpus() -> list[tuple[str, str]]:
    return [(name, path.name) for name in NAMES for path in sorted((SEEDS / name).iterdir())]


def test_every_target_has_seeds_and_a_short_run():
    assert set(NAMES) == set(targets.TARGETS) == set(SHORT_RUNS) == set(INSTRUMENTED)
    for name in NAMES:
        assert len(list((SEEDS / name).glob("seed-*"))) >= 4, name


@pytest.mark.parametrize(("name", "file"), _corpus())
def test_corpus_input_gives_a_result_or_the_documented_refusal(name, file):
    target = targets.TARGETS[name]
    started = time.monotonic()
    target.run((SEEDS / name / file).read_bytes())
    assert time.monotonic() - started < target.timeout


@pytest.mark.parametrize("name", NAMES)
def test_a_short_fuzz_run_finds_nothing(name, tmp_path):
    pytest.importorskip("atheris")
    target = targets.TARGETS[name]
    flags = [
        f"-runs={SHORT_RUNS[name]}",
        "-seed=15",
        "-max_total_time=20",
        f"-timeout={target.timeout}",
        f"-max_len={target.max_len}",
        "-print_final_stats=1",
        f"-artifact_prefix={tmp_path}/",
        *dictionary_flags(name),
    ]
    (tmp_path / "corpus").mkdir()
    process = subprocess.run(
        command(name, flags, [tmp_path / "corpus", SEEDS / name]),
        cwd=ROOT,
        env=child_env(tmp_path / "tmp"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        timeout=120,
    )
    output = process.stdout
    result = Result(name)
    add_stats(result, output)
    found = sorted(path.name for path in tmp_path.iterdir() if path.name.startswith(("crash-", "timeout-", "oom-")))
    assert (process.returncode, found) == (0, []), _failure(output)
    assert result.runs >= min(SHORT_RUNS[name], 100) and result.cov > 0, output[-3000:]


def _failure(output: str) -> str:
    """libFuzzer's report from the failing input on: the Python exception and the input."""
    start = output.find("=== Uncaught Python exception")
    return output[start:][:6000] if start >= 0 else output[-3000:]


# -- the in-process decode is the receiver's --------------------------------------------------


@pytest.fixture(scope="module")
def receiver():
    config = factory.config_model.model_validate(
        {"protocols": {"grpc": {"endpoint": "127.0.0.1:0"}, "http": {"endpoint": "127.0.0.1:0", "max_request_body_size": targets.BODY_LIMIT}}}
    )
    receiver = factory.create(make_settings("receivers", "otlp"), config, CapturingConsumer())
    receiver.start(TestHost())
    yield receiver
    receiver.shutdown()


def _cases() -> list[targets.OtlpCase]:
    """The otlp_decode corpus and, for each input, two mutants: three bytes changed, and cut short."""
    chooser, cases = random.Random(15), []
    for path in sorted((SEEDS / "otlp_decode").iterdir()):
        case = targets.OtlpCase.parse(path.read_bytes())
        if case is None:
            continue
        case = dataclasses.replace(case, layout="auto")  # the receiver's default
        payload = bytearray(case.payload)
        for _ in range(3):
            if payload:
                payload[chooser.randrange(len(payload))] = chooser.randrange(256)
        cut = chooser.randrange(len(case.payload) + 1)
        cases += [case, dataclasses.replace(case, payload=bytes(payload)), dataclasses.replace(case, payload=case.payload[:cut])]
    return cases


def _send(receiver, case: targets.OtlpCase) -> int:
    """The receiver's answer as an HTTP status; gRPC's OK as 200, INVALID_ARGUMENT as 400."""
    otlp = OTLP_SIGNALS[case.signal]
    if case.grpc:
        with grpc.insecure_channel("{}:{}".format(*receiver.grpc_address)) as channel:
            export = channel.unary_unary(otlp.grpc_method)
            try:
                export(case.payload, timeout=10)
            except grpc.RpcError as error:
                return {grpc.StatusCode.INVALID_ARGUMENT: 400}.get(error.code(), error.code())
            return 200
    headers, body = case.http_request()
    connection = http.client.HTTPConnection(*receiver.http_address, timeout=10)
    try:
        connection.putrequest("POST", otlp.http_path)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders(body)  # sent as it is: chunked bodies are framed already
        # Done sending: a chunked body cut short ends here, as the in-process stream does.
        connection.sock.shutdown(socket.SHUT_WR)
        return connection.getresponse().status
    finally:
        connection.close()


def test_the_receiver_answers_inputs_as_the_in_process_decode_does(receiver):
    answers = []
    for case in _cases():
        answers.append((targets.decode_case(case), _send(receiver, case), case))
    differ = [(expected, got, case.to_bytes()[:2].hex(), case.payload[:40]) for expected, got, case in answers if expected != got]
    assert differ == []
    seen = {(case.grpc, expected) for expected, _, case in answers}
    assert seen == {(False, 200), (False, 400), (True, 200), (True, 400)}


# -- profiles built by the strategy, under hypothesis ------------------------------------------


def test_profiles_keep_every_sample_when_batched_cut_and_merged():
    targets.profiles_merge_split()
