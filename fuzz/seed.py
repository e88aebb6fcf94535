#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz targets (docs/FUZZING.md) into a directory per target.

The seeds come from the project's own tests: the byte-string literals of the decoder's unit
tests (crates/protocol/src/tests/, src/chunked.rs) become request_decoder and chunked_body
inputs, and frames built like those of crates/wire's tests become lobby_frames and
worker_frames inputs, and operations of a lobby and an honest or hostile worker, in the encoding of
fuzz/src/shared_region.rs, become shared_region inputs. Each input starts with the choice bytes
its target reads first.

    python3 fuzz/seed.py OUT_DIR     # writes OUT_DIR/<target>/seed-NNNN

The fuzzer grows the corpus from these; `cargo fuzz cmin` then keeps what adds coverage, and
that is what fuzz/corpus/ holds.
"""

import argparse
import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LITERAL = re.compile(rb'b"((?:[^"\\]|\\.|\\\n)*)"', re.DOTALL)


def unescape(body):
    """A Rust byte-string literal's bytes."""
    out = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != 0x5C:  # backslash
            out.append(c)
            i += 1
            continue
        e = body[i + 1 : i + 2]
        if e == b"\n":  # a line continuation skips the next line's indentation
            i += 2
            while i < len(body) and body[i] in b" \t":
                i += 1
            continue
        if e == b"x":
            out.append(int(body[i + 2 : i + 4], 16))
            i += 4
            continue
        out += {b"r": b"\r", b"n": b"\n", b"t": b"\t", b"0": b"\0", b"\\": b"\\", b'"': b'"', b"'": b"'"}[e]
        i += 2
    return bytes(out)


def literals(paths):
    found = []
    for path in paths:
        for match in LITERAL.finditer(path.read_bytes()):
            value = unescape(match.group(1))
            if value not in found:
                found.append(value)
    return found


def frame(kind, flags, payload):
    return struct.pack("<BBHI", kind, flags, 0, len(payload)) + payload


def str16(value):
    return struct.pack("<H", len(value)) + value


def headers(pairs):
    return struct.pack("<H", len(pairs)) + b"".join(str16(n) + struct.pack("<I", len(v)) + v for n, v in pairs)


def request(body=b"hello", in_file=False, minor=1):
    payload = bytes([minor]) + str16(b"POST") + str16(b"/a%20b?x=1") + str16(b"127.0.0.1") + struct.pack("<H", 40000)
    payload += str16(b"localhost") + struct.pack("<H", 8000) + bytes([1])  # https
    payload += headers([(b"Host", b"example.org"), (b"X-Empty", b"")]) + struct.pack("<Q", len(body))
    return frame(16, 2 if in_file else 0, payload + (b"" if in_file else body))


def response_head(status=404, reason=b"Not Found", pairs=((b"Content-Type", b"text/plain"),), body=b"", end=True):
    payload = struct.pack("<H", status) + str16(reason) + headers(list(pairs)) + body
    return frame(3, 1 if end else 0, payload)


def queue(slot, id, seq, length):
    return bytes([0, slot, id, seq]) + struct.pack("<H", length)


def answer(pick, length, flags=0):
    return bytes([3, pick]) + struct.pack("<H", length) + bytes([flags])


def poke_word(field, slot, value):
    return bytes([9, field, slot]) + struct.pack("<Q", value)


TAKE, READ, DRAIN = b"\x02", b"\x04", b"\x0b"


def shared_region_seeds():
    """A layout byte, then operations (the table in fuzz/src/shared_region.rs)."""
    # 2 slots of 128 bytes and a 64-byte ring, where the second round of answers wraps.
    honest = queue(0, 3, 9, 20) + queue(1, 4, 2, 5) + TAKE + TAKE + answer(0, 10) + answer(1, 16, 1)
    honest += answer(1, 16, 1) + READ + READ + READ + bytes([5, 0, 5, 1, 6, 0, 6, 1])
    wraps = queue(0, 1, 0, 64) + TAKE + (answer(0, 8) + answer(0, 0) + answer(0, 16) + DRAIN) * 6
    recalls = queue(0, 1, 5, 10) + bytes([1, 0]) + TAKE + queue(0, 1, 6, 10) + TAKE + bytes([1, 0])
    recalls += queue(1, 2, 1, 0) + queue(2, 2, 1, 0) + queue(0, 255, 1, 0) + queue(1, 3, 1, 200)
    flags = bytes([7, 0, 7, 2, 7, 2, 7, 1, 7, 0, 7, 1, 7, 3, 7, 5, 7, 4, 7, 3, 7, 4])
    hostile = queue(0, 1, 0, 8) + TAKE + poke_word(0, 0, 240) + DRAIN + poke_word(0, 0, 24)
    hostile += poke_word(8, 0, 24 | 1 << 32) + DRAIN + bytes([10, 8]) + b"MAITRED\x02"
    hostile += bytes([10, 8]) + b"MAITRED\x01" + TAKE + poke_word(4, 0, 1) + TAKE
    lies = queue(0, 1, 0, 8) + answer(0x81, 8, 1) + DRAIN + poke_word(2, 0, 5) + bytes([7, 4])
    scribbles = queue(0, 1, 0, 8) + TAKE + answer(0, 4) + bytes([8, 0x0C, 0x11, 3, 1, 2, 3, 4]) + DRAIN
    return [
        bytes([0x01]) + honest,
        bytes([0x01]) + wraps,
        bytes([0x0B]) + wraps,
        bytes([0x03]) + recalls,
        bytes([0x00]) + flags,
        bytes([0x00]) + hostile,
        bytes([0x22]) + lies,
        bytes([0x01]) + scribbles,
    ]


def main(out):
    tests = sorted((ROOT / "crates/protocol/src/tests").glob("*.rs"))
    found = literals(tests)
    requests = [value for value in found if b" HTTP/" in value]
    chunked = [value.split(b"\r\n\r\n", 1)[1] for value in requests if b"chunked\r\n\r\n" in value]
    lines = [value for value in literals([ROOT / "crates/protocol/src/chunked.rs"]) if b"\r\n" not in value]
    chunked += [line + b"\r\nhello\r\n0\r\n\r\n" for line in lines]
    chunked += [b"5\r\nhello\r\n0\r\nVary: *\r\nX-Checksum: abc\r\n\r\n", b"0\r\n\r\n"]

    # REGION and BELL, each with its descriptor
    setup = frame(19, 2, b"") + frame(20, 2, b"")
    seeds = {
        # limits choice, split point (u16), then the request bytes
        "request_decoder": [
            bytes([choice]) + struct.pack("<H", len(r) // 2) + r for r in requests for choice in (0, 2)
        ],
        # max_body choice, split point, then the body
        "chunked_body": [bytes([0]) + struct.pack("<H", len(b) // 2) + b for b in chunked],
        # read-size seed, then the stream
        "lobby_frames": [
            struct.pack("<H", seed) + stream
            for seed, stream in enumerate(
                [
                    frame(1, 0, struct.pack("<I", 4242)) + response_head(body=b"missing"),
                    frame(1, 0, struct.pack("<I", 1))
                    + response_head(200, b"OK", end=False)
                    + frame(4, 0, b"x" * 100)
                    + frame(5, 3, struct.pack("<QQ", 10, 1 << 40)),
                    frame(1, 0, b"") + response_head(end=False) + frame(6, 0, b"ValueError: bad"),
                    frame(2, 0, b"ImportError: no module named app\n"),
                ]
            )
        ],
        "worker_frames": [
            struct.pack("<H", seed) + stream
            for seed, stream in enumerate(
                [
                    setup + request(),
                    setup + request(in_file=True) + frame(17, 0, struct.pack("<I", 7)) + request(b"", minor=0),
                    request(b"z" * 300),
                ]
            )
        ],
    }
    v2_signature = b"\r\n\r\n\x00\r\nQUIT\n"
    # versions choice, read-size seed, then the connection's first bytes
    seeds["proxy_header"] = [
        bytes([choice]) + struct.pack("<H", seed) + start
        for seed, start in enumerate(
            [
                b"PROXY TCP4 192.0.2.1 198.51.100.2 56324 443\r\nGET / HTTP/1.1\r\n",
                b"PROXY TCP6 2001:db8::1 ::1 65535 0\r\n",
                b"PROXY UNKNOWN\r\n",
                v2_signature
                + bytes([0x21, 0x11, 0, 17, 192, 0, 2, 1, 198, 51, 100, 2, 0xDC, 4, 1, 0xBB, 1, 0, 2])
                + b"h2GET",
                v2_signature + bytes([0x21, 0x21, 0, 36]) + bytes(15) + b"\x01" + bytes(16) + b"\x12\x34\x00\x50",
                v2_signature + bytes([0x20, 0x00, 0, 0]),
                v2_signature + bytes([0x21, 0x31, 0, 216]) + bytes(216),
            ]
        )
        for choice in (0, 1, 2)
    ]
    seeds["shared_region"] = shared_region_seeds()
    for target, inputs in seeds.items():
        directory = Path(out) / target
        directory.mkdir(parents=True, exist_ok=True)
        for number, data in enumerate(inputs):
            (directory / f"seed-{number:04}").write_bytes(data)
        print(f"{target}: {len(inputs)} seeds")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Writes each fuzz target's seed inputs into DIRECTORY/<target>/.")
    parser.add_argument("directory", help="where to write them (docs/FUZZING.md uses fuzz/harness/corpus)")
    main(parser.parse_args().directory)
