"""Read the records of wandb run files (run-*.wandb, as wandb-core 0.31 writes them), for
`autoteardown demo` and the tests. Not imported by the library proper; wandb is imported
only by records().

A file is a 7-byte header (b":W&B", magic 0xBEE1, version 0), then the
LevelDB log format: 32 KiB blocks of chunks, each a 7-byte header (crc32,
length, type) and its data. A record too long for the rest of a block is split
into FIRST, MIDDLE..., LAST chunks; a block's last bytes, if fewer than a chunk
header, are padding. The crc is zlib's CRC-32 of the type byte and the data.
Each record is a `wandb_internal_pb2.Record`. A tail cut off by a kill is
dropped.
"""

import struct
import zlib
from pathlib import Path

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32768
CHUNK = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def payloads(data):
    if not data.startswith(HEADER):
        raise ValueError("not a wandb run file")
    pos, parts = len(HEADER), []
    while pos + CHUNK.size <= len(data):
        room = BLOCK - pos % BLOCK
        crc, length, kind = CHUNK.unpack_from(data, pos)
        if room < CHUNK.size or (crc, length, kind) == (0, 0, 0):  # padding
            pos += room
            continue
        chunk = data[pos + CHUNK.size:pos + CHUNK.size + length]
        if len(chunk) < length:
            return  # cut off
        if zlib.crc32(chunk, zlib.crc32(bytes([kind]))) != crc or kind not in (FULL, FIRST, MIDDLE, LAST):
            raise ValueError(f"corrupt chunk at offset {pos}")
        pos += CHUNK.size + length
        parts = [chunk] if kind in (FULL, FIRST) else parts + [chunk]
        if kind in (FULL, LAST):
            yield b"".join(parts)


def records(path):
    """Every record of one run file."""
    from wandb.proto import wandb_internal_pb2

    result = []
    for payload in payloads(Path(path).read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        result.append(record)
    return result


def run_files(wandb_dir):
    """The run files under a WANDB_DIR, oldest run first."""
    return sorted(Path(wandb_dir).glob("wandb/*run-*/run-*.wandb"))


def history_steps(recs):
    return [r.history.step.num for r in recs if r.HasField("history")]


def exit_codes(recs):
    """The exit code of each exit record (a run that ended properly has one)."""
    return [r.exit.exit_code for r in recs if r.HasField("exit")]
