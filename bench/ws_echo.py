"""WebSocket echo round trips through the lobby: clients of the `websockets` library (sync), each
sending a 64-byte text message and waiting for its echo, in a loop, against maitred-stub
--websocket-echo (or any server echoing on /ws).

Usage: python bench/ws_echo.py PORT CLIENTS SECONDS
"""

from __future__ import annotations

import sys
import threading
import time

from websockets.sync.client import connect


def main() -> None:
    port, clients, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    counts = [0] * clients
    latencies: list[float] = []

    def run(index: int) -> None:
        with connect(f"ws://127.0.0.1:{port}/ws") as ws:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.perf_counter()
                ws.send("x" * 64)
                ws.recv()
                latencies.append(time.perf_counter() - started)
                counts[index] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1e3
    p99 = latencies[int(len(latencies) * 0.99)] * 1e3
    print(f"{clients} clients: {sum(counts) / seconds:.0f} round trips/s, p50 {p50:.3f} ms, p99 {p99:.3f} ms")


if __name__ == "__main__":
    main()
