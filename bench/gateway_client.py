"""One agent-like client of the Gateway workers bench, in a process of its own (so that the
clients' gRPC calls do not share one interpreter lock with each other and with the sink):
``python -m bench.gateway_client ENDPOINT PAYLOADS SECONDS IN_FLIGHT``.

Connects (one connection, a first request sent through it), prints "ready", waits for a line on stdin, then sends the payloads
round and round from IN_FLIGHT threads for SECONDS, each waiting for its answer, and prints the
samples it got taken as JSON."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from pathlib import Path

import grpc
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2

from bench.raw_codec import read_payloads
from bench.sink import SERVICE
from pycollector.pdata.serialized import read

TIMEOUT_S = 300.0


def main(endpoint: str, payload_file: str, seconds: str, in_flight: str) -> None:
    requests = read_payloads(Path(payload_file))
    samples_of = [read(request).samples for request in requests]
    with grpc.insecure_channel(endpoint, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        export = channel.unary_unary(f"/{SERVICE}/Export", response_deserializer=profiles_service_pb2.ExportProfilesServiceResponse.FromString)
        export(requests[0], timeout=TIMEOUT_S, wait_for_ready=True)
        print("ready", flush=True)
        sys.stdin.readline()
        numbers, lock, sent = itertools.count(), threading.Lock(), []
        began = time.perf_counter()

        def send() -> None:
            total = 0
            while time.perf_counter() - began < float(seconds):
                with lock:
                    index = next(numbers) % len(requests)
                export(requests[index], timeout=TIMEOUT_S)
                total += samples_of[index]
            with lock:
                sent.append(total)

        threads = [threading.Thread(target=send) for _ in range(int(in_flight))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    print(json.dumps({"samples": sum(sent)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
